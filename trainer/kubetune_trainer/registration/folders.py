"""Which folder the registration step logs (``spec.registration.select``): the final model, or
the checkpoint with the lowest eval loss, each checked to be this job's complete model; the trained
tokenizer's folder beside it (final/'s when a checkpoint was saved without one)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from kubetune_api.spec import Method
from kubetune_api.trainer_config import COMPLETE_MARKER, FINAL_DIR, TrainerConfig

from . import checkpoints
from .catalog import Selected, select_for_registration

log = logging.getLogger("kubetune_trainer.register")


class NothingToRegisterError(RuntimeError):
    """No complete final model, or one that does not match the spec."""


def final_dir(cfg: TrainerConfig) -> Path:
    """``<output_dir>/final``, refused unless training marked it complete and it matches the spec."""
    final = Path(cfg.output_dir) / FINAL_DIR
    if not (final / COMPLETE_MARKER).exists():
        raise NothingToRegisterError(
            f"{final} has no {COMPLETE_MARKER} marker: training did not finish writing the final model "
            "(nothing to register)"
        )
    written = checkpoints.marked_training(final)
    if written and written != cfg.training_hash():
        raise NothingToRegisterError(
            f"{final} was written by another training (training hash {written}, this job's "
            f"{cfg.training_hash()}): it is not this job's model (a reused storage claim?)"
        )
    _check_weights(cfg, final)
    return final


def _check_weights(cfg: TrainerConfig, folder: Path) -> None:
    has_adapter = (folder / "adapter_config.json").exists()
    if cfg.spec.method == Method.LORA and not has_adapter:
        raise NothingToRegisterError(f"{folder}: method is lora but there is no adapter_config.json")
    if cfg.spec.method == Method.FULL and not (folder / "config.json").exists():
        raise NothingToRegisterError(f"{folder}: method is full but there is no config.json")


TOKENIZER_FILE = "tokenizer_config.json"


@dataclass(frozen=True)
class ModelFolders:
    """What to log: the weights (final/ or a checkpoint) and the trained tokenizer's folder."""

    weights: Path
    tokenizer: Path
    selected: Selected


def selected_folders(cfg: TrainerConfig, final: Path) -> ModelFolders:
    """What ``spec.registration.select`` picks, checked as final/ is; a checkpoint saved without
    the tokenizer takes final/'s (the same trained tokenizer: training never changes it after the
    start)."""
    selected = select_for_registration(cfg.output_dir, str(cfg.spec.registration.select))
    folder = Path(selected.path)
    if folder == final:
        return ModelFolders(final, final, selected)
    if not (folder / COMPLETE_MARKER).exists():
        raise NothingToRegisterError(f"{folder} ({selected.label}) has no {COMPLETE_MARKER} marker")
    _check_weights(cfg, folder)
    tokenizer = folder if (folder / TOKENIZER_FILE).exists() else final
    if tokenizer == final:
        log.warning("%s has no tokenizer; using the trained tokenizer of %s", folder, final)
    log.info("registering %s (spec.registration.select %s)", folder, cfg.spec.registration.select)
    return ModelFolders(folder, tokenizer, selected)
