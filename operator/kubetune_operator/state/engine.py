"""Which training engine a job runs on (:class:`~kubetune_api.engines.Engine`), decided once. Pure.

In order, the first that answers:

1. ``status.engine``, recorded by the first pass that chose it: a job's engine never changes (an
   operator restarted with another default, or the other engine's CRD installed later, moves
   nothing). A job that has children but no recorded engine started before engines were recorded:
   it runs on the PyTorchJob, the only engine there was.
2. ``spec.engine``: forced, never another one. While its resource is not served the job waits
   (``EngineNotServed``, naming the CRD) and nothing is created.
3. The operator's default (``KUBETUNE_ENGINE``): an engine's name acts as (2); ``auto`` takes the
   first of :data:`~kubetune_api.engines.AUTO_ORDER` that the API server serves, and with none
   the job waits (``NoTrainingEngine``, naming each CRD) and nothing is created.

Whether a resource is served is a fact the pass reads (``Fact.SERVED``, by the engine's name:
the API server's discovery of the engine's group and version), only for a job whose engine is not
recorded yet. A chosen engine this operator version cannot run yet waits too (``EngineNotImplemented``),
recorded, with nothing created (an engine a newer API knows of; this version runs both
engines).
"""

from __future__ import annotations

from kubetune_api import spec as api
from kubetune_api.engines import AUTO, AUTO_ORDER, Engine
from kubetune_api.status import FineTuneJobStatus, Reason

from .observation import Fact, Observation

# the engines whose training object this version builds and follows
IMPLEMENTED = frozenset({Engine.PYTORCHJOB, Engine.TRAINJOB})


def recorded(prev: FineTuneJobStatus) -> Engine | None:
    """The engine the status records; a job with children and none recorded is older than the
    record: PyTorchJob. None: not chosen yet."""
    if prev.engine is not None:
        return Engine(prev.engine)
    children = prev.children
    if children is not None and (children.checkpoint_claim or children.py_torch_job):
        return Engine.PYTORCHJOB
    return None


def choose(obs: Observation, job: api.FineTuneJob) -> Engine | tuple[Reason, str]:
    """The engine of a job none is recorded for, or why it cannot have one yet (the condition's
    reason and message). Asks whether an engine is served (``Unread``) as it needs to know."""
    forced = job.spec.engine
    if forced is not None:
        return _forced(obs, Engine(forced), "spec.engine")
    if obs.default_engine != AUTO:
        return _forced(obs, Engine(obs.default_engine), "the operator's default engine (KUBETUNE_ENGINE)")
    for engine in AUTO_ORDER:
        if obs.read(Fact.SERVED, engine):
            return engine
    crds = " nor ".join(f"{e.crd} ({e}, {e.project})" for e in AUTO_ORDER)
    message = (
        f"no training engine: the API server serves neither {crds}. Install one of them; the job starts "
        "on the first one served, nothing is created until then"
    )
    return Reason.NO_TRAINING_ENGINE, message


def _forced(obs: Observation, engine: Engine, by: str) -> Engine | tuple[Reason, str]:
    if obs.read(Fact.SERVED, engine):
        return engine
    message = (
        f"{by} is {engine}, and the API server does not serve {engine.crd} ({engine.api_version} "
        f"{engine}): install {engine.project}. The job waits for it and never runs on another engine; "
        "nothing is created until then"
    )
    return Reason.ENGINE_NOT_SERVED, message


def not_implemented(engine: Engine) -> tuple[Reason, str]:
    """The condition of a job whose engine this operator version cannot run yet."""
    others = ", ".join(sorted(IMPLEMENTED))
    message = (
        f"the job's engine is {engine} (status.engine), which this version of the kubetune operator cannot "
        f"run yet (it runs {others}); nothing is created. Upgrade the operator, or re-create the job with "
        f"spec.engine set to one it runs"
    )
    return Reason.ENGINE_NOT_IMPLEMENTED, message
