"""kubetune's packed loss equals the padded loss of the same sequences (CPU: reference attention)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from kubetune_trainer.training import fast, varlen  # noqa: E402


def _tiny_varlen_model() -> object:
    """A two-layer Qwen2 with GQA on kubetune's varlen attention, fp32, fixed seed."""
    varlen.register()
    cfg = transformers.Qwen2Config(
        vocab_size=101,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(
        cfg, attn_implementation=varlen.NAME, dtype=torch.float32
    )


def test_packed_loss_equals_padded_loss() -> None:
    model = _tiny_varlen_model()
    seqs = [torch.randint(3, 101, (n,)).tolist() for n in (17, 40, 9, 33)]
    out = fast.check_packing_exact(model, seqs, device="cpu")
    assert out["relative_difference"] < 1e-5, out
    # a packed row without boundaries (one long example) gives a different loss: the check can fail
    merged = fast.check_packing_exact(model, [[t for s in seqs for t in s]], device="cpu")
    assert abs(merged["packed_loss"] - out["packed_loss"]) > 1e-4


def test_compiled_layers_train_like_eager_ones_across_packed_shapes() -> None:
    """fast.compile_layers on a PEFT model: same loss and adapter gradients as eager, for two packings.

    The backend here is aot_eager (dynamo's graph capture and AOT autograd, as on a GPU, without
    inductor's code generation, which takes minutes on this CPU); the GPU runs inductor.
    """
    import copy

    peft = pytest.importorskip("peft")
    base = _tiny_varlen_model()
    eager = peft.get_peft_model(
        base,
        peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "up_proj"]),
    )
    compiled = copy.deepcopy(eager)
    assert fast.compile_layers(compiled, backend="aot_eager") == 2
    assert all(layer._compiled_call_impl is not None for layer in fast.decoder_layers(compiled))

    for lengths in ((5, 9, 3), (12, 2)):
        ids = torch.randint(3, 101, (1, sum(lengths)))
        pos = torch.cat([torch.arange(n) for n in lengths])[None]
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
        batch = {
            "input_ids": ids,
            "position_ids": pos,
            "labels": ids,
            "cu_seq_lens_q": cu,
            "cu_seq_lens_k": cu,
            "max_length_q": 256,  # the length cap, as the fast trainer hands it to compiled layers
            "max_length_k": 256,
        }
        losses = []
        grads = []
        for model in (eager, compiled):
            model.zero_grad()
            loss = model(**batch).loss
            loss.backward()
            losses.append(float(loss.detach()))
            grads.append([p.grad.clone() for p in model.parameters() if p.requires_grad])
        assert abs(losses[0] - losses[1]) < 1e-5, losses
        assert max(float((a - b).abs().max()) for a, b in zip(*grads, strict=True)) < 1e-5


def test_compiled_layers_all_see_inputs_that_need_a_gradient() -> None:
    """With frozen embeddings (LoRA) the first layer is called like the others: one graph for all.

    Without the embeddings hook, layer 0's input needs no gradient while the others' do, and dynamo
    compiles a second graph (forward and backward) for that one layer.
    """
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(
        _tiny_varlen_model(), peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    )
    seen: list[bool] = []
    for layer in fast.decoder_layers(model):
        layer.register_forward_pre_hook(
            lambda _m, args, kwargs: seen.append(args[0].requires_grad), with_kwargs=True
        )
    ids = torch.randint(3, 101, (1, 12))
    model.train()
    model(input_ids=ids)
    assert seen == [False, True], seen  # what the compiled layers would otherwise see
    seen.clear()
    fast.compile_layers(model, backend="eager")
    model(input_ids=ids)
    assert seen == [True, True], seen
    # evaluation is untouched: no gradients wanted anywhere
    seen.clear()
    model.eval()
    with torch.no_grad():
        model(input_ids=ids)
    assert seen == [False, False], seen


def test_compile_workers_share_the_pods_cpu_request_among_the_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch._inductor.config as inductor_config

    monkeypatch.setattr(inductor_config, "compile_threads", inductor_config.compile_threads)  # restored after
    monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS", raising=False)
    monkeypatch.setenv("KUBETUNE_CPUS", "32")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert fast.size_compile_workers() == 4 and inductor_config.compile_threads == 4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert fast.size_compile_workers() == 32  # inductor's own ceiling
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "3")  # an explicit setting wins
    inductor_config.compile_threads = 3
    assert fast.size_compile_workers() == 3


def test_compiled_layers_take_floats_as_constants() -> None:
    """No float attribute of a LoRA layer becomes a graph input (a float64 CPU tensor under dynamic shapes).

    Dynamo would make each one (norm epsilon, attention scaling, dropout p, LoRA scaling) an input,
    which inductor converts with a host C++ kernel; as constants they vanish from the graphs.
    """
    peft = pytest.importorskip("peft")
    torch._dynamo.reset()
    model = peft.get_peft_model(
        _tiny_varlen_model(),
        peft.LoraConfig(
            r=4, lora_alpha=8, lora_dropout=0.1, target_modules=["q_proj", "v_proj", "down_proj"]
        ),
    )
    graphs: list[list[object]] = []

    def record(gm: torch.fx.GraphModule, inputs: list[object]) -> object:
        graphs.append(list(inputs))
        return gm.forward

    previous = torch._dynamo.config.specialize_float
    torch._dynamo.config.specialize_float = False  # dynamo's default, which compile_layers changes
    try:
        fast.compile_layers(model, backend=record)
        model.train()
        model(input_ids=torch.randint(3, 101, (1, 12)))
    finally:
        torch._dynamo.config.specialize_float = previous
        torch._dynamo.reset()
    assert graphs
    floats = [x for g in graphs for x in g if isinstance(x, torch.Tensor) and x.dtype == torch.float64]
    assert floats == [], [tuple(x.shape) for x in floats]
