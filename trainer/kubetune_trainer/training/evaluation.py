"""The two evaluations outside the Trainer's schedule: the base model before training, the final model
after it.

- Base: when ``spec.registration.gate.minImprovement`` is set and there is eval data, the model as
  loaded (for LoRA, the base with its adapter still at zero: the base's outputs) is evaluated on the
  eval set before the first step of the job's first attempt, and the loss kept in
  ``<output_dir>/base-eval.json`` (:func:`kubetune_trainer.volume.catalog.base_eval_loss` reads it). It is
  measured once: a restart, or a later job on the same volume with the same training hash, reuses it.
- Final: when there is eval data and the last evaluation was not at the final step, the final model
  is evaluated, so that ``final/COMPLETE`` carries its eval loss.

Every rank calls these (an evaluation is collective); rank 0 writes.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

from kubetune_api.trainer_config import TrainerConfig, dump_json

from ..volume.catalog import BASE_EVAL_FILE

log = logging.getLogger(__name__)

BASE_PREFIX = "base"  # the Trainer logs the base evaluation as base_loss, never as eval_loss
BASE_METRIC = "kubetune.base_eval_loss"


def wants_base_eval(cfg: TrainerConfig, has_eval: bool) -> bool:
    gate = cfg.spec.registration.gate if cfg.spec.registration else None
    return has_eval and gate is not None and gate.min_improvement is not None


def _measured(output_dir: Path, training_hash: str) -> float | None:
    """The base eval loss already measured for this training (None: not yet, or for another)."""
    try:
        data = json.loads((output_dir / BASE_EVAL_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("training_hash") not in (None, training_hash):
        return None
    value = data.get("eval_loss")
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def base_eval(
    trainer: Any, cfg: TrainerConfig, *, resumed: bool, is_rank0: bool, tracker: Any = None
) -> float | None:
    """The base model's eval loss (measured now on a first attempt, else as measured before); None
    when no gate asks for it. Rank 0 writes base-eval.json and logs it to the MLflow run."""
    if not wants_base_eval(cfg, trainer.eval_dataset is not None):
        return None
    output_dir = Path(cfg.output_dir)
    known = _measured(output_dir, cfg.training_hash())
    if known is not None or resumed:
        # a restart starts from trained weights: never measure those as the base
        return known
    started = time.monotonic()
    metrics = trainer.evaluate(metric_key_prefix=BASE_PREFIX)
    loss = float(metrics[f"{BASE_PREFIX}_loss"])
    if is_rank0:
        dump_json(
            {
                "eval_loss": loss if math.isfinite(loss) else None,
                "training_hash": cfg.training_hash(),
                "eval_rows": len(trainer.eval_dataset),
                "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            },
            output_dir / BASE_EVAL_FILE,
        )
        log.info(
            "base model eval loss %.4f (%.1f s), for spec.registration.gate", loss, time.monotonic() - started
        )
        if tracker is not None:
            tracker.log_metrics({BASE_METRIC: loss}, 0)
    return loss if math.isfinite(loss) else None


def final_eval(trainer: Any) -> float | None:
    """The final model's eval loss: the Trainer's evaluation at the final step when it ran one, else a
    new one now; None without eval data."""
    if trainer.eval_dataset is None:
        return None
    step = trainer.state.global_step
    at_end = [e["eval_loss"] for e in trainer.state.log_history if "eval_loss" in e and e.get("step") == step]
    # the Trainer evaluates at its eval steps; at the end only when the last step is one of them
    loss = float(at_end[-1]) if at_end else float(trainer.evaluate()["eval_loss"])
    return loss if math.isfinite(loss) else None
