"""The state machine's input for table tests: a job ``j`` in ``ml`` whose children exist."""

from __future__ import annotations

from typing import Any

from kubetune_operator.state import Observation

T0 = "2026-01-01T00:00:00Z"
T1 = "2026-01-01T01:00:00Z"


def obs(**kw: Any) -> Observation:
    base: dict[str, Any] = {
        "generation": 1,
        "now": T0,
        "namespace": "ml",
        "job_name": "j",
        "pytorchjob_name": "j-train",
        "registration_job_name": "j-register",
        "checkpoint_claim": "j-ckpt",
        "children": {"checkpointClaim": "j-ckpt", "configMap": "j-config", "pytorchJob": "j-train"},
    }
    base.update(kw)
    return Observation(**base)
