"""kubetune's sync-free fused linear cross-entropy equals plain autograd cross-entropy (CPU path)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kubetune_trainer.training import flce  # noqa: E402


def _reference(x, weight, target, bias, reduction, softcap):  # type: ignore[no-untyped-def]
    logits = x @ weight.t()
    if bias is not None:
        logits = logits + bias
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    return torch.nn.functional.cross_entropy(logits, target, ignore_index=-100, reduction=reduction)


@pytest.mark.parametrize(
    ("reduction", "softcap", "with_bias", "frozen_weight", "chunk_mem_const"),
    [
        ("mean", None, False, False, 1),
        ("sum", None, False, True, 1),  # LoRA: the LM head is frozen
        ("mean", 7.0, True, False, 1),
        ("sum", None, True, False, 64),  # one chunk
    ],
)
def test_loss_and_gradients_match_autograd(
    reduction, softcap, with_bias, frozen_weight, chunk_mem_const
) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    rows, hidden, vocab = 37, 8, 50  # vocab/hidden -> several chunks of rows with chunk_mem_const=1
    x = torch.randn(rows, hidden, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(vocab, hidden, dtype=torch.float64, requires_grad=not frozen_weight)
    bias = torch.randn(vocab, dtype=torch.float64, requires_grad=True) if with_bias else None
    target = torch.randint(0, vocab, (rows,))
    target[::5] = -100  # ignored positions (prompt tokens, sequence boundaries)
    scale = torch.tensor(0.37, dtype=torch.float64)  # the trainer's 1/num_items_in_batch, a device tensor

    assert flce._chunk_rows(rows, hidden, vocab, chunk_mem_const) < rows or chunk_mem_const > 1
    loss = flce.fused_linear_cross_entropy(
        x, weight, target, bias=bias, reduction=reduction, softcap=softcap, chunk_mem_const=chunk_mem_const
    )
    (loss * scale).backward()
    got = [t.grad.clone() for t in (x, weight, bias) if t is not None and t.requires_grad]
    for t in (x, weight, bias):
        if t is not None:
            t.grad = None

    ref = _reference(x, weight, target, bias, reduction, softcap)
    (ref * scale).backward()
    want = [t.grad for t in (x, weight, bias) if t is not None and t.requires_grad]

    torch.testing.assert_close(loss.double(), ref.double(), rtol=1e-6, atol=1e-9)
    assert len(got) == len(want) == (2 if frozen_weight is False else 1) + (1 if with_bias else 0)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-9)


def test_no_gradients_under_no_grad_and_other_options_refused_without_liger() -> None:
    torch.manual_seed(1)
    x, weight = torch.randn(6, 4), torch.randn(11, 4)
    target = torch.tensor([1, 2, -100, 3, 4, 5])
    with torch.no_grad():
        loss = flce.fused_linear_cross_entropy(x, weight, target)
    torch.testing.assert_close(loss, _reference(x, weight, target, None, "mean", None))
    if flce._original is None:
        with pytest.raises(ValueError, match="plain sum/mean"):
            flce.fused_linear_cross_entropy(x, weight, target, label_smoothing=0.1)


def test_install_replaces_ligers_function_once() -> None:
    functional = pytest.importorskip("liger_kernel.transformers.functional")
    before = functional.liger_fused_linear_cross_entropy
    try:
        assert flce.install()
        assert functional.liger_fused_linear_cross_entropy is flce.fused_linear_cross_entropy
        assert flce.install()  # idempotent: the original is kept, not replaced by ourselves
        assert flce._original is not flce.fused_linear_cross_entropy
        if before is not flce.fused_linear_cross_entropy:
            assert flce._original is before  # options kubetune does not handle still reach Liger
    finally:
        functional.liger_fused_linear_cross_entropy = before
