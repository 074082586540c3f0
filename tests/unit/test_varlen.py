"""Packed rows with the varlen attention give the same logits as each example alone."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from kubetune_trainer.training import varlen  # noqa: E402


def _tiny(kv_heads: int, attn: str):  # type: ignore[no-untyped-def]
    cfg = transformers.Qwen2Config(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=torch.float32)
    return model.eval()


@pytest.mark.parametrize("kv_heads", [4, 2], ids=["mha", "gqa"])
@pytest.mark.parametrize("handed_boundaries", [False, True], ids=["from-position-ids", "from-collator"])
def test_packed_equals_separate(kv_heads: int, handed_boundaries: bool) -> None:
    varlen.register()
    ref = _tiny(kv_heads, "sdpa")
    packed_model = _tiny(kv_heads, varlen.NAME)
    packed_model.load_state_dict(ref.state_dict())
    torch.manual_seed(1)
    docs = [torch.randint(0, 97, (n,)) for n in (7, 12, 5)]
    with torch.no_grad():
        alone = [ref(input_ids=d[None]).logits[0] for d in docs]
        ids = torch.cat(docs)[None]
        pos = torch.cat([torch.arange(len(d)) for d in docs])[None]
        kwargs = {}
        if handed_boundaries:
            kwargs = {
                "cu_seq_lens_q": torch.tensor([0, 7, 19, 24], dtype=torch.int32),
                "max_length_q": 12,
                "cu_seq_lens_k": torch.tensor([0, 7, 19, 24], dtype=torch.int32),
                "max_length_k": 12,
            }
        packed = packed_model(input_ids=ids, position_ids=pos, **kwargs).logits[0]
    torch.testing.assert_close(packed, torch.cat(alone), rtol=1e-4, atol=1e-4)
    # and attention really is cut at the boundaries: sdpa over the packed row (no mask) differs
    with torch.no_grad():
        leaky = ref(input_ids=ids).logits[0]
    assert not torch.allclose(leaky[7:], torch.cat(alone)[7:], atol=1e-3)


def test_cu_seqlens_from_position_ids() -> None:
    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3], [0, 1, 0, 1, 2, 3, 4, 5, 6]])
    cu, max_len = varlen.cu_seqlens_from_position_ids(pos)
    assert cu.tolist() == [0, 3, 5, 9, 11, 18]
    assert max_len == 7


def test_forward_skips_transformers_mask_preparation(monkeypatch: pytest.MonkeyPatch) -> None:
    """No packed-sequence scan of the position ids: on a GPU it reads back to the host every forward."""
    from transformers import masking_utils

    varlen.register()
    model = _tiny(2, varlen.NAME)
    scans: list[int] = []
    original = masking_utils.find_packed_sequence_indices

    def counting(position_ids):  # type: ignore[no-untyped-def]
        scans.append(1)
        return original(position_ids)

    monkeypatch.setattr(masking_utils, "find_packed_sequence_indices", counting)
    ids = torch.randint(0, 97, (1, 12))
    pos = torch.cat([torch.arange(5), torch.arange(7)])[None]
    with torch.no_grad():
        logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits
    assert logits.shape == (1, 12, 97)
    assert scans == []
    # the check can fail: an attention that transformers builds masks for does scan them
    with torch.no_grad():
        _tiny(2, "sdpa")(input_ids=ids, position_ids=pos, use_cache=False)
    assert scans == [1]


def test_kernel_choice_comes_from_the_tuning_config_and_bad_values_name_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kubetune_api.tuning import TuningConfig

    monkeypatch.setattr(varlen, "_kernel", varlen._kernel)  # put back afterwards
    varlen.register()
    assert varlen._kernel == "flash"
    varlen.register(TuningConfig.from_env({varlen.KERNEL_ENV: "flash-repeat"}).varlen_kernel)
    assert varlen._kernel == "flash-repeat"
    monkeypatch.setenv(varlen.KERNEL_ENV, "flash")  # the environment is the config's, not varlen's
    varlen.register(None)
    assert varlen._kernel == "flash"
    with pytest.raises(ValueError, match="KUBETUNE_VARLEN_KERNEL must be flash or flash-repeat"):
        TuningConfig.from_env({varlen.KERNEL_ENV: "xformers"})
    with pytest.raises(ValueError, match="KUBETUNE_VARLEN_KERNEL must be one of flash, flash-repeat"):
        varlen.use_kernel("xformers")
    assert varlen._kernel == "flash"


def test_the_admitted_values_are_the_kernels_the_trainer_has() -> None:
    from kubetune_api.tuning import tuning_env_error

    assert all(tuning_env_error(varlen.KERNEL_ENV, k) is None for k in varlen.KERNELS)
    assert tuning_env_error(varlen.KERNEL_ENV, "cudnn") is not None


@pytest.mark.parametrize("window", [None, 3], ids=["causal", "sliding-window"])
@pytest.mark.parametrize("limit", [1, 12, 256], ids=["one-example-a-run", "some", "all-in-one"])
def test_runs_of_whole_examples_equal_each_example_alone(window: int | None, limit: int) -> None:
    """The CPU path (SDPA over runs of whole examples, each run with its block-diagonal mask) gives
    what example-by-example attention gives, forward and backward, however the examples are grouped."""
    torch.manual_seed(2)
    lengths = [7, 12, 5, 1, 9]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    q, k, v = (torch.randn(sum(lengths), 4, 8, requires_grad=True) for _ in range(3))
    grads = []
    for fn in (varlen.reference, varlen.by_runs):
        if fn is varlen.by_runs:
            runs = varlen.runs(cu.tolist(), limit=limit)
            assert [n for _, _, ls in runs for n in ls] == lengths
            assert all(end - start <= max(limit, *ls) for start, end, ls in runs)
        out = (
            fn(q, k, v, cu, None, window) if fn is varlen.reference else fn(q, k, v, cu, None, window, limit)
        )
        (g,) = torch.autograd.grad((out * torch.arange(out.numel()).reshape(out.shape)).sum(), [q])
        grads.append((out.detach(), g))
    torch.testing.assert_close(grads[1][0], grads[0][0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(grads[1][1], grads[0][1], rtol=1e-4, atol=1e-4)
