"""On a CUDA GPU: the varlen kernel and kubetune's fused loss agree with the reference paths."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (run on the device machine)", allow_module_level=True)
transformers = pytest.importorskip("transformers")

from kubetune_trainer.training import fast, varlen  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("kernel", varlen.KERNELS)
def test_varlen_kernel_matches_reference_with_gqa(kernel: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every KUBETUNE_VARLEN_KERNEL choice: output and gradients against fp32 SDPA per example."""
    monkeypatch.setattr(varlen, "_kernel", varlen._kernel)  # put back afterwards
    varlen.use_kernel(kernel)
    torch.manual_seed(0)
    lengths = [300, 17, 1024, 5, 700]
    total = sum(lengths)
    q = torch.randn(total, 16, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(total, 4, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(total, 4, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    query, key, value = (t.transpose(0, 1)[None] for t in (q, k, v))  # (1, heads, seq, dim)
    out, _ = varlen.varlen_attention_forward(
        None, query, key, value, None, scaling=128**-0.5, cu_seq_lens_q=cu, max_length_q=max(lengths)
    )
    grad = torch.randn_like(out)
    out.backward(grad)
    ref_in = [t.detach().float().requires_grad_(True) for t in (q, k, v)]
    kk, vv = (t.repeat_interleave(4, dim=1) for t in ref_in[1:])
    ref = varlen.reference(ref_in[0], kk, vv, cu, 128**-0.5, None)
    ref.backward(grad[0].float())
    torch.testing.assert_close(out[0].float(), ref, atol=2e-2, rtol=2e-2)
    for got, want in zip((q, k, v), ref_in, strict=True):
        assert got.grad is not None and want.grad is not None
        err = (got.grad.float() - want.grad).abs().max() / want.grad.abs().max()
        assert err < 2e-2, (kernel, float(err))


def test_varlen_kernel_takes_fp32_inputs_as_qlora_gives_them() -> None:
    """QLoRA's fp32 hidden states give fp32 q, k, v: computed in bf16, returned in fp32, gradients flow."""
    torch.manual_seed(0)
    lengths = [300, 17, 700]
    total = sum(lengths)
    q, k, v = (
        torch.randn(total, heads, 128, device="cuda", dtype=torch.float32, requires_grad=True)
        for heads in (16, 4, 4)
    )
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    query, key, value = (t.transpose(0, 1)[None] for t in (q, k, v))
    out, _ = varlen.varlen_attention_forward(
        None, query, key, value, None, scaling=128**-0.5, cu_seq_lens_q=cu, max_length_q=max(lengths)
    )
    assert out.dtype == torch.float32
    kk, vv = (t.detach().repeat_interleave(4, dim=1) for t in (k, v))
    ref = varlen.reference(q.detach(), kk, vv, cu, 128**-0.5, None)
    torch.testing.assert_close(out[0], ref, atol=2e-2, rtol=2e-2)
    out.sum().backward()
    assert q.grad is not None and q.grad.dtype == torch.float32


def test_packed_fused_loss_matches_padded_loss_on_gpu() -> None:
    varlen.register()
    cfg = transformers.Qwen2Config(
        vocab_size=32000,
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=2048,
    )
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(
            cfg, attn_implementation=varlen.NAME, dtype=torch.bfloat16
        )
    assert fast.apply_liger(model)
    seqs = [torch.randint(10, 32000, (n,)).tolist() for n in (900, 33, 1024, 410)]
    out = fast.check_packing_exact(model, seqs, device="cuda")
    assert out["relative_difference"] < 5e-3, out


def test_larger_loss_chunks_give_the_same_loss_and_gradients() -> None:
    """The plan's loss_chunk_factor changes how Liger chunks the LM head, not what it computes."""
    cfg = transformers.Qwen3Config(
        vocab_size=151936,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    assert fast.apply_liger(model)
    ids = torch.randint(10, 151936, (1, 4000), device="cuda")
    results = []
    for factor in (1, 64):
        model.zero_grad()
        extra = {"chunk_mem_const": factor} if factor > 1 else {}
        loss = model(input_ids=ids, labels=ids, skip_logits=True, **extra).loss
        loss.backward()
        results.append(
            (
                float(loss),
                model.lm_head.weight.grad.clone(),
                model.model.layers[0].mlp.up_proj.weight.grad.clone(),
            )
        )
    (l1, w1, u1), (l2, w2, u2) = results
    assert abs(l1 - l2) < 1e-5 * abs(l1), (l1, l2)
    torch.testing.assert_close(w2, w1, atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(u2, u1, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("frozen_head", [True, False])
def test_sync_free_loss_head_matches_liger_and_never_waits_for_the_gpu(
    reduction: str, frozen_head: bool
) -> None:
    from kubetune_trainer.training import flce

    assert flce.install()
    torch.manual_seed(0)
    rows, hidden, vocab = 3000, 512, 151936
    x0 = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
    w0 = torch.randn(vocab, hidden, device="cuda", dtype=torch.bfloat16) * 0.02
    target = torch.randint(0, vocab, (rows,), device="cuda")
    target[::7] = -100
    scale = torch.tensor(1 / 1234.0, device="cuda")

    def run(fn, check_syncs: bool = False):  # type: ignore[no-untyped-def]
        x = x0.clone().requires_grad_(True)
        w = w0.clone().requires_grad_(not frozen_head)
        if check_syncs:
            torch.cuda.set_sync_debug_mode("error")
        try:
            loss = fn(x, w, target, reduction=reduction)
            (loss * scale).backward()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        return loss.float(), x.grad.float(), None if frozen_head else w.grad.float()

    run(flce.fused_linear_cross_entropy)  # compiles the kernel
    ours = run(flce.fused_linear_cross_entropy, check_syncs=True)  # raises on any host sync
    liger = run(flce._original)
    torch.testing.assert_close(ours[0], liger[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours[1], liger[1], rtol=2e-2, atol=1e-6)
    if not frozen_head:
        torch.testing.assert_close(ours[2], liger[2], rtol=2e-2, atol=1e-6)
    with pytest.raises(RuntimeError):  # the check can fail: Liger's own function waits for the GPU
        run(flce._original, check_syncs=True)


def test_fp8_layers_train_like_bf16() -> None:
    """KUBETUNE_FP8=tensorwise: the decoder layers' large products in float8 (compiled, as the plan
    runs them) give a loss within float8 rounding of bf16's on the same weights and batch, and train.

    A Llama model: the tests above apply Liger to Qwen2 and Qwen3, and Liger's patches replace those
    modeling modules' classes for every model built afterwards in this process.
    """
    if torch.cuda.get_device_capability(0) < (8, 9):
        pytest.skip("float8 tensor cores need compute capability 8.9+")
    pytest.importorskip("torchao.float8")
    from tests.support.models import fp8_sized_llama
    from torchao.float8.float8_linear import Float8Linear

    model = fp8_sized_llama("cuda")
    ids = torch.randint(0, 4096, (4, 512), device="cuda")

    def loss() -> torch.Tensor:
        return model(input_ids=ids, labels=ids).loss

    with torch.no_grad():
        reference = float(loss())
    # per layer: q, o, gate, up, down (k and v project to 512 features: below the threshold)
    assert fast.apply_fp8(model, "tensorwise") == 2 * 5
    assert not isinstance(model.lm_head, Float8Linear)
    assert fast.compile_layers(model) == 2
    with torch.no_grad():
        converted = float(loss())
    assert abs(converted - reference) / reference < 0.02, (converted, reference)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(8):
        step = loss()
        step.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(step))
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0] * 0.9, losses


def test_the_gpu_memory_cap_holds_the_allocator(monkeypatch: pytest.MonkeyPatch) -> None:
    """KUBETUNE_GPU_MEMORY_GIB: past the cap an allocation fails in this process."""
    from kubetune_api.tuning import GPU_MEMORY_ENV
    from kubetune_trainer.plan.plan import limit_gpu_memory

    monkeypatch.setenv(GPU_MEMORY_ENV, "4")
    torch.cuda.empty_cache()
    try:
        fraction = limit_gpu_memory()
        assert fraction is not None and 0 < fraction < 1
        small = torch.empty(2**30, dtype=torch.uint8, device="cuda")  # 1 GiB: within the cap
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(4 * 2**30, dtype=torch.uint8, device="cuda")
        del small
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()
