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


def _settled(ctx: Any, obj: dict[str, Any], previous: Any, decide: Any) -> Any:
    """``decide`` (one of ``state.exits``' choices) on the pass's first observation of ``obj`` with
    ``previous`` as its status, each fact it asks for read as a pass reads it."""
    from dataclasses import replace

    from kubetune_operator import reconcile, state
    from kubetune_operator.state.observation import Unread

    # a job that ran on the PyTorchJob (the pass names its engine before any exit: state.engine)
    seen = replace(reconcile.observe(ctx, obj), previous=previous, engine=state.Engine.PYTORCHJOB)
    while True:
        try:
            return seen, decide(seen)
        except Unread as need:
            seen = reconcile.carry_out(ctx, seen, state.Read(need.fact, need.name, need.held), [])


def registration_retry(ctx: Any, obj: dict[str, Any], previous: Any) -> Any:
    """The exit ``state.exits.retry`` chooses for ``obj``, with the deletion it asks carried out."""
    from kubetune_operator import reconcile
    from kubetune_operator.state import exits

    seen, (reregister, deletes) = _settled(ctx, obj, previous, exits.retry)
    for delete in deletes:
        reconcile.carry_out(ctx, seen, delete, [])
    return reregister


def registration_turned_on(ctx: Any, obj: dict[str, Any], previous: Any) -> Any:
    """The exit ``state.exits.turned_on`` chooses for ``obj``."""
    from kubetune_operator.state import exits

    return _settled(ctx, obj, previous, exits.turned_on)[1]
