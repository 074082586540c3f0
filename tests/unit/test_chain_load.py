"""Chained jobs, trainer side: which starting model a job loads (:mod:`kubetune_trainer.sources.chain`),
the training hash that keeps another parent's checkpoints from being resumed, and where the local
runner looks for a parent's run folder.

Real parts: the tiny model, a real LoRA adapter (non-zero, so merging changes the weights) saved
as training saves it, real files on disk; no MLflow (the registered path is in tests/e2e).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.conftest import TINY_DATA, trainer_config

from kubetune_api.trainer_config import COMPLETE_MARKER, FINAL_DIR, START_FILE, ParentModel, TrainerConfig
from kubetune_trainer.sources.data_check import BadInputError

TEMPLATE = "{%- for m in messages -%}PARENT {{ m['content'] }}{%- endfor -%}"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from kubetune_trainer.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", TINY_DATA)


def child(tmp_path: Path, this_method: str = "lora", **parent: Any) -> TrainerConfig:
    """A config of a job (``this_method``) from a parent job, as the operator or the local runner
    fills it (``parent``: the ParentModel's fields, wire names)."""
    path = trainer_config(tmp_path / "child", tmp_path, method=this_method, name="child")
    data = json.loads(json.dumps(TrainerConfig.load(path).wire()))
    data["spec"]["model"] = {"fromJob": {"name": "parent"}}
    data["parent"] = {"job": "parent", "uid": "u-1", **parent}
    return TrainerConfig.model_validate(data)


def save_adapter(model_dir: Path, folder: Path) -> None:
    """A LoRA parent's final/: a random (non-zero) adapter, its trained tokenizer, the marker."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(1)
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(base, lora).save_pretrained(str(folder))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(folder)
    (folder / COMPLETE_MARKER).write_text(json.dumps({"step": 3}))


def full_parent(model_dir: Path, folder: Path) -> None:
    """A full parent's checkpoint: the model, plus a checkpoint's optimizer and trainer state."""
    import shutil

    shutil.copytree(model_dir, folder)
    for name in ("optimizer.pt", "trainer_state.json", "rng_state.pth"):
        (folder / name).write_text("not model weights")
    (folder / COMPLETE_MARKER).write_text(json.dumps({"step": 8}))


# --- loading decisions -------------------------------------------------------------------------------


def test_lora_parent_is_merged_into_its_base_with_the_parents_tokenizer(
    tmp_path: Path, tiny_model: Path
) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kubetune_trainer.sources import chain
    from kubetune_trainer.sources.model import model_source

    adapter = tmp_path / "parent" / FINAL_DIR
    save_adapter(tiny_model, adapter)
    cfg = child(tmp_path, path=str(adapter), method="lora", basePath=str(tiny_model))

    where, kwargs = model_source(cfg)
    assert Path(where) == tmp_path / "child" / chain.START_DIR and kwargs == {}
    merged = AutoModelForCausalLM.from_pretrained(where)
    expected = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model), adapter
    ).merge_and_unload()
    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    name = "model.layers.0.self_attn.q_proj.weight"
    got, want, before = (m.state_dict()[name] for m in (merged, expected, base))
    assert torch.allclose(got, want, atol=1e-6) and not torch.allclose(got, before)
    assert AutoTokenizer.from_pretrained(where).chat_template == TEMPLATE  # the parent's, not the base's

    start = json.loads((tmp_path / "child" / START_FILE).read_text())
    assert start["parent"]["job"] == "parent" and start["folder"] == chain.START_DIR
    # made once: a second reader (another rank, a restart, the registration) finds it
    stamp = (Path(where) / "model.safetensors").stat().st_mtime_ns
    assert chain.ensure_start(cfg).folder == Path(where)
    assert (Path(where) / "model.safetensors").stat().st_mtime_ns == stamp


def test_adapter_base_falls_back_to_the_adapters_own_record(tmp_path: Path, tiny_model: Path) -> None:
    from kubetune_trainer.sources import chain

    adapter = tmp_path / "parent" / FINAL_DIR
    save_adapter(tiny_model, adapter)
    assert chain.adapter_base(adapter, ParentModel(path=str(adapter))) == str(tiny_model)
    assert chain.adapter_base(adapter, ParentModel(path=str(adapter), base_path="/b")) == "/b"


def test_full_parent_loads_in_place_for_full_and_is_copied_for_lora(tmp_path: Path, tiny_model: Path) -> None:
    from kubetune_trainer.sources import chain

    folder = tmp_path / "parent" / "checkpoints" / "checkpoint-8"
    full_parent(tiny_model, folder)

    full = chain.ensure_start(child(tmp_path / "a", "full", path=str(folder), method="full"))
    assert full.folder == folder  # nothing copied: a full job trains the parent's weights where they are
    assert not (tmp_path / "a" / "child" / chain.START_DIR).exists()

    lora = chain.ensure_start(child(tmp_path / "b", "lora", path=str(folder), method="full"))
    copied = sorted(p.name for p in lora.folder.iterdir())
    assert lora.folder == tmp_path / "b" / "child" / chain.START_DIR
    assert "model.safetensors" in copied and "tokenizer.json" in copied
    assert not {"optimizer.pt", "trainer_state.json", "rng_state.pth", COMPLETE_MARKER} & set(copied)


def test_another_parent_makes_the_starting_model_again(tmp_path: Path, tiny_model: Path) -> None:
    from kubetune_trainer.sources import chain

    one, two = tmp_path / "p1", tmp_path / "p2"
    full_parent(tiny_model, one)
    full_parent(tiny_model, two)
    first = child(tmp_path, "lora", path=str(one), method="full")
    chain.ensure_start(first)
    assert chain.read_start(first) is not None
    second = child(tmp_path, "lora", path=str(two), method="full", uid="u-2")
    assert chain.read_start(second) is None  # recorded for p1: not this parent's
    assert chain.ensure_start(second).parent.uid == "u-2"


def test_incomplete_or_missing_parent_is_refused_naming_the_field(tmp_path: Path, tiny_model: Path) -> None:
    from kubetune_trainer.sources import chain

    with pytest.raises(
        chain.ChainError, match=r"spec.model.fromJob: the parent's model folder .* does not exist"
    ):
        chain.ensure_start(child(tmp_path, path=str(tmp_path / "nowhere"), method="full"))
    half = tmp_path / "half"
    half.mkdir()
    (half / "config.json").write_text("{}")
    with pytest.raises(chain.ChainError, match=r"spec.model.fromJob: .*half has no COMPLETE marker"):
        chain.ensure_start(child(tmp_path, path=str(half), method="full"))
    cfg = child(tmp_path, path=str(half))
    cfg = cfg.model_copy(update={"parent": None})
    with pytest.raises(
        chain.ChainError, match=r"spec.model.fromJob parent: the trainer config names no parent"
    ):
        chain.ensure_start(cfg)


# --- the training hash -------------------------------------------------------------------------------


def test_training_hash_follows_the_parent(tmp_path: Path) -> None:
    base = child(tmp_path, path="/var/lib/kubetune-parent/final", method="lora")
    same_elsewhere = child(tmp_path, path="/mnt/elsewhere/final", method="lora")
    assert same_elsewhere.training_hash() == base.training_hash()  # a folder counts by its name
    for other in (
        child(tmp_path, path="/var/lib/kubetune-parent/final", method="lora", uid="u-2"),
        child(tmp_path, path="/var/lib/kubetune-parent/checkpoints/checkpoint-50", method="lora"),
        child(tmp_path, path="/var/lib/kubetune-parent/final", method="lora", fingerprint="f00d"),
    ):
        assert other.training_hash() != base.training_hash()


def test_training_hash_follows_the_version_a_registered_alias_resolved_to(tmp_path: Path) -> None:
    path = trainer_config(tmp_path / "out", tmp_path, method="lora", name="r")
    data = json.loads(json.dumps(TrainerConfig.load(path).wire()))
    data["spec"]["model"] = {"registered": "models:/assistant@champion"}
    cfg = TrainerConfig.model_validate(data)
    unresolved = cfg.training_hash()

    def record(version: int, registered: str = "models:/assistant@champion") -> str:
        start = {
            "source": {"registered": registered},
            "parent": {"modelUri": f"models:/assistant/{version}", "method": "full"},
            "folder": "prepared/model",
        }
        (tmp_path / "out" / START_FILE).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "out" / START_FILE).write_text(json.dumps(start))
        return cfg.training_hash()

    v1, v2 = record(1), record(2)
    assert len({unresolved, v1, v2}) == 3
    assert record(1) == v1
    assert record(2, registered="models:/assistant@other") == unresolved  # another source's record


def test_a_job_that_is_not_chained_keeps_its_hash(tmp_path: Path) -> None:
    cfg = TrainerConfig.load(trainer_config(tmp_path / "out", tmp_path, method="lora", name="plain"))
    with_parent = cfg.model_copy(update={"parent": ParentModel(job="x", uid=str(uuid.uuid4()))})
    assert with_parent.training_hash() == cfg.training_hash()


# --- the local runner ----------------------------------------------------------------------------------


def test_local_runner_looks_beside_this_run_and_names_the_field(tmp_path: Path, tiny_model: Path) -> None:
    from kubetune_cli.run import CONFIG_FILE, local_parent

    runs = tmp_path / "runs"
    with pytest.raises(BadInputError) as e:
        local_parent(runs / "parent", "parent", "final", runs=runs)
    assert (
        f"spec.model.fromJob.name parent: kubetune run --local looks for its run folder beside this job's, {runs / 'parent'}"
        in str(e.value)
    )
    assert "there is no such folder" in str(e.value)

    folder = runs / "parent"
    parent_cfg = TrainerConfig.load(trainer_config(folder, tiny_model, method="lora", name="parent"))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG_FILE).write_text(parent_cfg.to_yaml())
    with pytest.raises(BadInputError, match=r"final has no COMPLETE marker: parent has not finished"):
        local_parent(folder, "parent", "final", runs=runs)

    save_adapter(tiny_model, folder / FINAL_DIR)
    with pytest.raises(BadInputError, match=r"spec.model.fromJob.checkpoint is bestEval, but no checkpoint"):
        local_parent(folder, "parent", "bestEval", runs=runs)
    found = local_parent(folder, "parent", "final", runs=runs)
    assert found.path == str((folder / FINAL_DIR).resolve()) and found.method == "lora"
    assert found.base_path == str(tiny_model)  # the parent's own spec.model.path
    assert found.fingerprint


def test_preparation_tokenizes_with_the_parents_tokenizer(tmp_path: Path, tiny_model: Path) -> None:
    """The preparation step puts the merged model in place and tokenizes with the parent's tokenizer
    (its template: every example starts with PARENT); the trainer then finds the prepared data."""
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    from kubetune_trainer.preparation.prepare import prepare
    from kubetune_trainer.sources.prepared import prepared, read_manifest

    adapter = tmp_path / "parent" / FINAL_DIR
    save_adapter(tiny_model, adapter)
    cfg = child(tmp_path, path=str(adapter), method="lora", basePath=str(tiny_model))
    cfg = cfg.model_copy(
        update={
            "spec": cfg.spec.model_copy(
                update={"training": cfg.spec.training.model_copy(update={"assistant_only_loss": False})}
            )
        }
    )
    prepare(cfg)
    found = prepared(cfg)
    assert found is not None and found.model_dir is None
    assert read_manifest(tmp_path / "child")["model"]["start"]["job"] == "parent"
    tokenizer = AutoTokenizer.from_pretrained(adapter)
    row = load_from_disk(str(found.train_dir))[0]["input_ids"]
    assert str(tokenizer.decode(row)).startswith("PARENT")


def test_the_checkpoints_pages_sample_of_a_missing_parent_folder_is_the_message() -> None:
    from tests.support import docs_samples
    from tests.support.controlplane import REPO

    from kubetune_cli.run import local_parent

    (block,) = [
        b
        for b in docs_samples.code_blocks(REPO / "docs" / "checkpoints.md")
        if b.text.startswith("kubetune: spec.model.fromJob.name a:")
    ]
    runs = Path("/home/me/runs")
    assert not runs.exists()
    with pytest.raises(BadInputError) as e:
        local_parent(runs / "a", "a", "final", runs=runs)
    assert block.text == f"kubetune: {e.value}\n"
