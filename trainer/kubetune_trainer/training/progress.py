"""Training progress into the FineTuneJob status (``status.progress``, ``status.checkpoints``).

In a cluster, rank 0 patches the ``finetunejobs/status`` subresource with the pod's service-account
token (in-cluster config); the operator's RBAC grants the trainer's service account exactly that
(``patch`` on ``finetunejobs/status``). Patches are throttled (at most every ``min_interval_s``,
plus one at each checkpoint and at the end), and an API error never fails training: it is logged
once and the next report tries again. Locally (``report_progress: false``) nothing is reported.

The status fields (camelCase, as in :class:`kubetune_api.status.Progress`)::

    progress:    step, totalSteps, percent, epoch, loss, evalLoss, baseEvalLoss, tokensPerSecond,
                 etaSeconds, updatedAt
    checkpoints: latest, latestStep, count, bestStep, items (the catalog: kubetune_trainer.volume.catalog)
    mlflow:      trackingUri, experimentId, runId (the run this training logs to, once it exists)

and goodput, budget, memoryRetries beside them: only the fields :mod:`kubetune_api.ownership` gives
the trainer (the operator writes the rest; a patch naming one of its fields is refused here).

>>> p = ProgressState(total_steps=100)
>>> p.update(step=1, epoch=0.0, now=2.0, start=0.0)
>>> p.update(step=25, epoch=0.5, now=50.0, start=0.0)  # 2 s per step, 75 to go
>>> p.as_status()["progress"]["percent"], p.as_status()["progress"]["etaSeconds"]
(25, 150)
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubetune_api.ownership import Writer, check_patch
from kubetune_api.spec import GROUP, PLURAL, VERSION

log = logging.getLogger(__name__)

MIN_INTERVAL_S = 15.0
PatchFn = Callable[[dict[str, Any]], None]
# What TRL's preference trainers log (DPO and ORPO alike) -> status.progress: the chosen answer's reward
# above the rejected one's, and the share of pairs where it is above (MLflow keeps TRL's names, with _
# for /: rewards_margins, eval_rewards_accuracies)
PREFERENCE_METRICS = {
    "rewards/margins": "rewardMargin",
    "rewards/accuracies": "rewardAccuracy",
    "eval_rewards/margins": "evalRewardMargin",
    "eval_rewards/accuracies": "evalRewardAccuracy",
}


def _shown(loss: float | None) -> float | None:
    """A loss as the status shows it (``kubectl get finetunejobs``' LOSS column): four significant
    digits, as the trainer's log prints them. The exact values are MLflow's metrics and the
    checkpoint catalog's. Not finite: as it is (the caller drops it).

    >>> [_shown(x) for x in (7.279966831207275, 0.0123456, 1543.21, None)]
    [7.28, 0.01235, 1543.0, None]
    """
    if loss is None or not math.isfinite(loss):
        return loss
    return float(f"{loss:.4g}")


def _now_rfc3339() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class ProgressState:
    """What rank 0 knows about the run; pure, so it is easy to test."""

    total_steps: int
    step: int = 0
    epoch: float | None = None
    loss: float | None = None
    eval_loss: float | None = None
    # the base model's eval loss, before the first step (evaluation.base_eval; catalog.base_eval_loss)
    base_eval_loss: float | None = None
    # preference tuning's rewards (TRL's rewards/margins and rewards/accuracies, with eval_ before them
    # at an evaluation): status.progress.rewardMargin and the like (PREFERENCE_METRICS)
    rewards: dict[str, float] = field(default_factory=dict)
    tokens_per_second: float | None = None
    eta_seconds: int | None = None
    checkpoint_latest: str | None = None
    checkpoint_step: int | None = None
    checkpoint_count: int | None = None
    # the checkpoint catalog (catalog.status_of): bestStep and items, beside latest/latestStep/count
    checkpoint_catalog: dict[str, Any] | None = None
    mlflow: dict[str, str] | None = None
    # trainer-owned status beside the progress: goodput, budget, memoryRetries (camelCase; ownership.OWNERS)
    extra: dict[str, Any] = field(default_factory=dict)
    # For the ETA: steps done by this attempt, and when it started (a resumed run starts mid-way).
    _first_step: int | None = field(default=None, repr=False)

    def update(self, *, step: int, epoch: float | None, now: float, start: float) -> None:
        if self._first_step is None:
            self._first_step = 0 if step <= 1 else step - 1
        self.step = step
        self.epoch = epoch
        done = step - self._first_step
        elapsed = now - start
        if done > 0 and elapsed > 0 and self.total_steps:
            self.eta_seconds = max(0, round((self.total_steps - step) * elapsed / done))

    def as_status(self) -> dict[str, Any]:
        percent = round(100 * self.step / self.total_steps) if self.total_steps else None
        progress = {
            "step": self.step,
            "totalSteps": self.total_steps,
            "percent": min(percent, 100) if percent is not None else None,
            "epoch": round(self.epoch, 4) if self.epoch is not None else None,
            "loss": _shown(self.loss),
            "evalLoss": _shown(self.eval_loss),
            "baseEvalLoss": _shown(self.base_eval_loss),
            **{key: _shown(value) for key, value in self.rewards.items()},
            "tokensPerSecond": round(self.tokens_per_second, 1) if self.tokens_per_second else None,
            "etaSeconds": self.eta_seconds,
            "updatedAt": _now_rfc3339(),
        }
        sent: dict[str, Any] = {k: v for k, v in progress.items() if v is not None}
        # JSON has no NaN or infinity: the API server refused the whole update with one in it, so
        # the status kept an old, finite loss. A null in a merge patch removes the field instead.
        for key in ("loss", "evalLoss", "baseEvalLoss", *PREFERENCE_METRICS.values()):
            value = sent.get(key)
            if isinstance(value, float) and not math.isfinite(value):
                sent[key] = None
        status: dict[str, Any] = {"progress": sent}
        if self.checkpoint_latest is not None:
            status["checkpoints"] = {
                "latest": self.checkpoint_latest,
                "latestStep": self.checkpoint_step,
                "count": self.checkpoint_count,
            }
        if self.checkpoint_catalog is not None:
            # a merge patch keeps a key it is not sent: an absent bestStep goes as null (removed)
            status["checkpoints"] = {
                "bestStep": None,
                **status.get("checkpoints", {}),
                **self.checkpoint_catalog,
            }
        if self.mlflow:
            status["mlflow"] = dict(self.mlflow)
        status.update({k: v for k, v in self.extra.items() if v is not None})
        check_patch(status, Writer.TRAINER)
        return status


def status_patcher(api_client: Any, namespace: str, name: str) -> PatchFn:
    """A function that merge-patches the FineTuneJob's status through ``api_client``."""
    from kubernetes import client

    api = client.CustomObjectsApi(api_client)

    def patch(status: dict[str, Any]) -> None:
        # A dict body goes out as a JSON merge patch: only the keys sent change, so the operator's
        # phase and conditions are left alone.
        api.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, name, {"status": status}, _request_timeout=10
        )

    return patch


def in_cluster_patcher(namespace: str, name: str) -> PatchFn:
    """:func:`status_patcher` with the pod's service-account token (in-cluster config)."""
    from kubernetes import client, config

    config.load_incluster_config()
    return status_patcher(client.ApiClient(), namespace, name)


class ProgressReporter:
    """Throttled, failure-proof status reports. ``patch=None`` makes every call a no-op."""

    def __init__(
        self,
        patch: PatchFn | None,
        total_steps: int,
        *,
        min_interval_s: float = MIN_INTERVAL_S,
        mlflow: Callable[[], dict[str, str] | None] | None = None,
    ) -> None:
        self.patch = patch
        # the MLflow run, asked at each report (it may only exist once the server answers)
        self.mlflow = mlflow
        self.state = ProgressState(total_steps=total_steps)
        self.min_interval_s = min_interval_s
        self.start = time.monotonic()
        self._last_sent = float("-inf")
        self._failing = False
        self.sent = 0

    @property
    def enabled(self) -> bool:
        return self.patch is not None

    def report(self, *, force: bool = False) -> bool:
        """Send the current state if forced or the interval has passed; True when it was sent."""
        if self.patch is None:
            return False
        now = time.monotonic()
        if not force and now - self._last_sent < self.min_interval_s:
            return False
        self._last_sent = now
        if self.mlflow is not None and self.state.mlflow is None:
            self.state.mlflow = self.mlflow()
        try:
            self.patch(self.state.as_status())
        except Exception as e:  # API down, RBAC, object deleted: progress is never worth a failed run
            if not self._failing:
                log.warning("could not report progress to the FineTuneJob status: %s", _short(e))
            self._failing = True
            return False
        if self._failing:
            log.info("progress reports reach the FineTuneJob status again")
        self._failing = False
        self.sent += 1
        return True

    def on_step(self, step: int, epoch: float | None) -> None:
        self.state.update(step=step, epoch=epoch, now=time.monotonic(), start=self.start)
        self.report()

    def on_log(self, logs: dict[str, Any], tokens_per_second: float | None) -> None:
        if "loss" in logs:
            self.state.loss = float(logs["loss"])
        if "eval_loss" in logs:
            self.state.eval_loss = float(logs["eval_loss"])
        for logged, key in PREFERENCE_METRICS.items():
            if logged in logs:
                self.state.rewards[key] = float(logs[logged])
        if tokens_per_second:
            self.state.tokens_per_second = tokens_per_second

    def on_checkpoint(self, path: Path, step: int, count: int, listed: dict[str, Any] | None = None) -> None:
        """A checkpoint is complete: report it now, with the catalog (``listed``:
        :func:`kubetune_trainer.volume.catalog.status_of`) when given."""
        self.state.checkpoint_latest = str(path)
        self.state.checkpoint_step = step
        self.state.checkpoint_count = count
        if listed is not None:
            self.state.checkpoint_catalog = listed
        self.report(force=True)


def _short(e: Exception, limit: int = 200) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[:limit] + "..."
