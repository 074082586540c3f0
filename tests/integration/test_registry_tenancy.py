"""Tenancy of the model registry through the real API server and the operator: a job in one namespace
naming another namespace's model (to register, or to start from) ends Failed on the operator's first
pass with reason ModelNameNotAllowed, the field and the rule in its message and a Warning event, and
no child is ever created; a name of its own proceeds; with tenancy off the same job proceeds. Past the
first pass (a status forged by another hand, or a job that started before tenancy was on) the rule is
checked again before the registration Job: none is created, and the job fails with the rule named."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from tests.integration.conftest import (
    condition,
    events_for,
    get_job,
    kopf_runner,
    load_example,
    now,
    phase_of,
    set_pytorchjob_condition,
    wait_for,
    wait_phase,
)

pytestmark = [pytest.mark.integration]

CHILDREN = [
    ("v1", "PersistentVolumeClaim", "ckpt"),
    ("v1", "ConfigMap", "config"),
    ("v1", "ServiceAccount", "trainer"),
    ("kubeflow.org/v1", "PyTorchJob", "train"),
    ("batch/v1", "Job", "prepare"),
]


@contextlib.contextmanager
def _operator(monkeypatch: pytest.MonkeyPatch, namespace: str, mode: str) -> Iterator[Any]:
    monkeypatch.setenv("KUBETUNE_REGISTRY_TENANCY", mode)
    monkeypatch.setenv("KUBETUNE_REGISTRY_MODEL_NAMES", json.dumps({namespace: ["shared-*"]}))
    with kopf_runner(namespace) as runner:
        yield runner


@pytest.fixture
def tenancy_on(
    operator_env: dict[str, str], namespace: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Any]:
    with _operator(monkeypatch, namespace, "namespace-prefix") as runner:
        yield runner


@pytest.fixture
def tenancy_off(
    operator_env: dict[str, str], namespace: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Any]:
    with _operator(monkeypatch, namespace, "off") as runner:
        yield runner


def _job(namespace: str, name: str, model_name: str, registered: str | None = None) -> dict[str, Any]:
    doc = load_example("qwen3-4b-full.yaml", namespace)
    doc["metadata"]["name"] = name
    doc["spec"]["registration"]["modelName"] = model_name
    if registered:
        doc["spec"]["model"] = {"registered": registered}
    return doc


def _children(kube: Any, namespace: str, name: str) -> list[str]:
    return [
        f"{kind} {name}-{suffix}"
        for api, kind, suffix in CHILDREN
        if kube.get(api, kind, namespace, f"{name}-{suffix}") is not None
    ]


@pytest.mark.parametrize(
    ("model_name", "registered", "field", "name"),
    [
        ("team-b.assistant", None, "spec.registration.modelName", "team-b.assistant"),
        ("{ns}-assistant", None, "spec.registration.modelName", "{ns}-assistant"),
        ("{ns}.assistant", "models:/team-b.base@champion", "spec.model.registered", "team-b.base"),
    ],
    ids=["another-namespaces-model", "dash-is-no-separator", "starts-from-another-namespaces-model"],
)
def test_a_name_outside_the_namespace_fails_the_job_and_creates_nothing(
    tenancy_on: Any, kube: Any, namespace: str, model_name: str, registered: str | None, field: str, name: str
) -> None:
    kube.create(_job(namespace, "outside", model_name.format(ns=namespace), registered))
    obj = wait_phase(kube, namespace, "outside", "Failed", timeout=30)
    ready = condition(obj, "Ready")
    assert ready["reason"] == "ModelNameNotAllowed"
    assert f"{field} '{name.format(ns=namespace)}' is outside its namespace's names" in ready["message"]
    assert (
        f"namespace {namespace} may use model names starting with '{namespace}.' or matching shared-*"
        in (ready["message"])
    )
    # the event follows the status write
    warnings = wait_for(
        lambda: [e for e in events_for(kube, namespace, "outside") if e["type"] == "Warning"],
        what="a Warning",
    )
    assert [e["reason"] for e in warnings] == ["ModelNameNotAllowed"]
    time.sleep(2)  # more passes (the resync, the events): still nothing
    assert _children(kube, namespace, "outside") == []
    assert wait_phase(kube, namespace, "outside", "Failed")["status"]["phase"] == "Failed"


def _proceeds(kube: Any, namespace: str, name: str) -> None:
    """The PyTorchJob is created and the job, once its status is written, is not Failed."""
    wait_for(
        lambda: kube.get("kubeflow.org/v1", "PyTorchJob", namespace, f"{name}-train"), what="the PyTorchJob"
    )
    phase = wait_for(lambda: phase_of(kube, namespace, name), what="a phase")
    assert phase != "Failed", get_job(kube, namespace, name)["status"]


@pytest.mark.parametrize("model_name", ["{ns}.assistant", "shared-assistant"])
def test_a_name_of_its_own_or_granted_proceeds(
    tenancy_on: Any, kube: Any, namespace: str, model_name: str
) -> None:
    kube.create(_job(namespace, "inside", model_name.format(ns=namespace)))
    _proceeds(kube, namespace, "inside")


def test_with_tenancy_off_another_namespaces_name_proceeds(
    tenancy_off: Any, kube: Any, namespace: str
) -> None:
    kube.create(_job(namespace, "outside", "team-b.assistant", "models:/team-b.base@champion"))
    _proceeds(kube, namespace, "outside")


def _no_registration(kube: Any, namespace: str, name: str, *, trained: bool) -> None:
    """Failed with ModelNameNotAllowed (Ready and Registered, the rule named, a Warning event), and no
    registration Job, then or after more passes. ``trained``: the job's training object exists (the
    check before the registration Job says so); else the status alone claimed training, and the job is
    refused as on a first pass."""
    obj = wait_phase(kube, namespace, name, "Failed", timeout=30)
    # refused as on a first pass, the registration was never reached: Ready names the rule
    for ctype in ("Ready", "Registered") if trained else ("Ready",):
        found = condition(obj, ctype)
        assert found["reason"] == "ModelNameNotAllowed", obj["status"]
        assert (f"registration Job {name}-register not created" in found["message"]) is trained
        assert (
            "spec.registration.modelName 'team-b.assistant' is outside its namespace's names"
            in found["message"]
        )
        assert f"namespace {namespace} may use model names starting with '{namespace}.'" in found["message"]
    wait_for(
        lambda: [e for e in events_for(kube, namespace, name) if e["reason"] == "ModelNameNotAllowed"],
        what="a ModelNameNotAllowed event",
    )
    time.sleep(2)  # more passes (the resync, the events): still no registration Job
    assert kube.get("batch/v1", "Job", namespace, f"{name}-register") is None
    assert phase_of(kube, namespace, name) == "Failed"


def test_a_status_forged_past_the_first_pass_registers_nothing_outside_its_names(
    operator_env: dict[str, str], kube: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job's status is written (by someone with rights to the status) before the operator's
    first pass: training "finished", registering. No training object of the job's exists, so the
    operator refuses it as on a first pass (the status alone never counts as started)."""
    kube.create(_job(namespace, "forged", "team-b.assistant"))
    forged = {
        "phase": "Registering",
        "conditions": [
            {
                "type": "Training",
                "status": "False",
                "reason": "TrainingSucceeded",
                "message": "forged",
                "lastTransitionTime": now(),
            }
        ],
    }
    kube.patch(
        "kubetune.io/v1alpha1", "FineTuneJob", namespace, "forged", {"status": forged}, subresource="status"
    )
    with _operator(monkeypatch, namespace, "namespace-prefix"):
        _no_registration(kube, namespace, "forged", trained=False)


def test_a_job_that_started_before_tenancy_trains_on_but_registers_nothing_outside_its_names(
    operator_env: dict[str, str], kube: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Started under an operator with tenancy off; the operator is then upgraded with tenancy on: the
    training goes on (nothing stops it), and once it has succeeded no registration Job is created."""
    kube.create(_job(namespace, "older", "team-b.assistant"))
    with _operator(monkeypatch, namespace, "off"):
        _proceeds(kube, namespace, "older")
    with _operator(monkeypatch, namespace, "namespace-prefix"):
        set_pytorchjob_condition(kube, namespace, "older-train", "Succeeded")
        _no_registration(kube, namespace, "older", trained=True)
