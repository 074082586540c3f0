"""The training engine of a job, through the real API server and the operator (issue 31 item 1):
``auto`` records PyTorchJob where its CRD is served; a recorded engine survives an operator
restart with another default and the other engine's CRD installed since; a job that forces
TrainJob never runs as a PyTorchJob: while TrainJob is not served it waits with a condition naming
the CRD, nothing created. A job on TrainJob once served: tests/integration/test_operator_trainjob.py
(Trainer v2.2.0's real CRDs).

No Kubeflow Trainer v2 runs here: where TrainJob must be served, the test registers a minimal CRD
named ``trainjobs.trainer.kubeflow.org`` (group, version, kind and plural as Trainer v2's; any
fields), removed after the test. The PyTorchJob CRD is the suite's own (the real one, when
``../shared/crds`` has it)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from tests.integration.conftest import (
    condition,
    events_for,
    get_job,
    kopf_runner,
    load_example,
    set_pytorchjob_condition,
    wait_for,
    wait_phase,
)
from tests.integration.test_operator_children import children_by_kind
from tests.support.controlplane import ControlPlane

from kubetune_api.engines import Engine
from kubetune_operator import builders, observations

pytestmark = pytest.mark.integration

TRAINJOB = Engine.TRAINJOB
# the smallest CRD the API server serves as Trainer v2's TrainJob (not its schema: any fields)
TRAINJOB_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": TRAINJOB.crd},
    "spec": {
        "group": TRAINJOB.group,
        "scope": "Namespaced",
        "names": {
            "kind": "TrainJob",
            "plural": TRAINJOB.plural,
            "singular": "trainjob",
            "listKind": "TrainJobList",
        },
        "versions": [
            {
                "name": TRAINJOB.version,
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                },
                "subresources": {"status": {}},
            }
        ],
    },
}


def _served(kube: Any, engine: Engine) -> bool:
    return observations.serves(kube.resources(engine.api_version), engine.plural)


@pytest.fixture
def install_trainjob_crd(control_plane: ControlPlane, kube: Any) -> Iterator[Callable[[], None]]:
    """Registers the minimal TrainJob CRD when called (and waits until it is served); removed after."""

    def install() -> None:
        control_plane.kubectl("apply", "-f", "-", input=json.dumps(TRAINJOB_CRD))
        wait_for(lambda: _served(kube, TRAINJOB), what="trainjobs served")

    yield install
    control_plane.kubectl("delete", "crd", TRAINJOB.crd, "--ignore-not-found", check=False)
    wait_for(lambda: not _served(kube, TRAINJOB), what="trainjobs no longer served")


def _create(kube: Any, namespace: str, **spec: Any) -> str:
    doc = load_example("qwen3-4b-full.yaml", namespace)
    doc["spec"].update(spec)
    kube.create(doc)
    return str(doc["metadata"]["name"])


def _reason(obj: dict[str, Any], type_: str) -> str | None:
    found = [c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == type_]
    return found[0]["reason"] if found else None


def _nothing_created(kube: Any, namespace: str, name: str) -> None:
    assert all(names == [] for names in children_by_kind(kube, namespace, name).values())
    assert kube.list("v1", "ServiceAccount", namespace, f"{builders.LABEL_JOB}={name}") == []


def test_auto_records_pytorchjob_and_nothing_flips_it_later(
    kube: Any,
    namespace: str,
    operator_env: dict[str, str],
    install_trainjob_crd: Callable[[], None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert _served(kube, Engine.PYTORCHJOB) and not _served(kube, TRAINJOB)
    name = _create(kube, namespace)
    with kopf_runner(namespace):
        obj = wait_for(
            lambda: (job := get_job(kube, namespace, name)).get("status", {}).get("engine") and job,
            what="status.engine",
        )
        assert obj["status"]["engine"] == "PyTorchJob"
        wait_for(
            lambda: kube.get("kubeflow.org/v1", "PyTorchJob", namespace, f"{name}-train"),
            what="the PyTorchJob",
        )
    # the other engine's CRD installed since, and an operator restarted with TrainJob as its default
    install_trainjob_crd()
    monkeypatch.setenv("KUBETUNE_ENGINE", "TrainJob")
    with kopf_runner(namespace):
        set_pytorchjob_condition(kube, namespace, f"{name}-train", "Running")
        obj = wait_phase(kube, namespace, name, "Training")
    assert obj["status"]["engine"] == "PyTorchJob"
    assert kube.list(TRAINJOB.api_version, "TrainJob", namespace) == []
    assert children_by_kind(kube, namespace, name)["PyTorchJob"] == [f"{name}-train"]


def test_forced_trainjob_not_served_waits_and_creates_nothing(
    kube: Any, namespace: str, operator: Any
) -> None:
    assert _served(kube, Engine.PYTORCHJOB) and not _served(kube, TRAINJOB)
    name = _create(kube, namespace, engine="TrainJob")

    def waiting() -> dict[str, Any] | None:
        obj = get_job(kube, namespace, name)
        return obj if _reason(obj, "ChildrenReady") == "EngineNotServed" else None

    obj = wait_for(waiting, what="ChildrenReady EngineNotServed")
    assert obj["status"]["phase"] == "Pending"
    assert "engine" not in obj["status"]  # no engine chosen: none served
    for type_ in ("ChildrenReady", "Training", "Ready"):
        c = condition(obj, type_)
        assert (c["status"], c["reason"]) == ("False", "EngineNotServed")
        assert "trainjobs.trainer.kubeflow.org" in c["message"] and "spec.engine" in c["message"]
    wait_for(
        lambda: any(
            e["reason"] == "EngineNotServed" and e["type"] == "Warning"
            for e in events_for(kube, namespace, name)
        ),
        what="the Warning event",
    )
    _nothing_created(kube, namespace, name)  # not a PyTorchJob either: no fallback
