"""The training hash in every COMPLETE marker: the same training never changes it, another one does."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kubetune_api.trainer_config import TrainerConfig, load_manifest, resolve

REPO = Path(__file__).resolve().parents[2]


def _cfg() -> TrainerConfig:
    return resolve(load_manifest(REPO / "examples" / "tiny-local.yaml"), output_dir="/tmp/run")


def _set(**fields: Any) -> Callable[[TrainerConfig], None]:
    def change(cfg: TrainerConfig) -> None:
        for dotted, value in fields.items():
            *path, leaf = dotted.split("__")
            target: Any = cfg.spec
            for part in path:
                target = getattr(target, part)
            setattr(target, leaf, value)

    return change


@pytest.mark.parametrize(
    "change",
    [
        _set(training__max_steps=500),  # continued further
        _set(training__save_steps=7, training__logging_steps=3, training__save_total_limit=9),
        _set(
            training__torch_compile="never", training__liger=False, training__gradient_checkpointing="always"
        ),
        _set(registration__alias="champion", suspend=True),
    ],
)
def test_the_same_training_keeps_its_hash(change: Callable[[TrainerConfig], None]) -> None:
    cfg = _cfg()
    changed = cfg.model_copy(deep=True)
    change(changed)
    assert changed.training_hash() == cfg.training_hash()


def test_local_files_moved_elsewhere_are_the_same_training() -> None:
    """``kubetune run --local`` resolves paths against the cache and manifest folders: only names count."""
    here, there = _cfg().model_copy(deep=True), _cfg().model_copy(deep=True)
    here.spec.model.path, there.spec.model.path = (
        "/home/a/.cache/kubetune/tiny-qwen2",
        "/srv/cache/tiny-qwen2",
    )
    here.spec.dataset.path, there.spec.dataset.path = (
        "/home/a/jobs/data/chat.jsonl",
        "/mnt/jobs/data/chat.jsonl",
    )
    assert here.training_hash() == there.training_hash()


@pytest.mark.parametrize(
    "change",
    [
        _set(training__learning_rate=0.123),
        _set(training__batch_size=3),
        _set(training__max_length=77),
        _set(training__seed=1234),
        _set(dataset__path="/data/other-chat.jsonl"),
        _set(model__path="/models/another-model"),
    ],
)
def test_another_training_has_another_hash(change: Callable[[TrainerConfig], None]) -> None:
    cfg = _cfg()
    changed = cfg.model_copy(deep=True)
    change(changed)
    assert changed.training_hash() != cfg.training_hash()


def test_lora_defaults_written_out_or_not_are_the_same_training() -> None:
    from kubetune_api.spec import LoraSpec

    cfg = _cfg()
    assert cfg.spec.method == "lora"
    spelled = cfg.model_copy(deep=True)
    spelled.spec.lora = LoraSpec()
    bare = cfg.model_copy(deep=True)
    bare.spec.lora = None
    assert spelled.training_hash() == bare.training_hash()
    other = cfg.model_copy(deep=True)
    other.spec.lora = LoraSpec(r=4)
    assert other.training_hash() != bare.training_hash()
