"""The operator against the real API server: the whole flow, with the test playing the Kubeflow
Training Operator and the Job controller."""

from __future__ import annotations

import json
from typing import Any

import pytest
from tests.integration.conftest import (
    API_VERSION,
    condition,
    events_for,
    finish_registration_job,
    get_job,
    load_example,
    set_pytorchjob_condition,
    wait_for,
    wait_phase,
)

from kubetune_api.spec import RETRY_REGISTRATION_ANNOTATION as RETRY

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

RESULT = {
    "name": "qwen3_4b_assistant",
    "version": "3",
    "uri": "models:/qwen3_4b_assistant/3",
    "run_id": "0a1b2c3d4e5f",
    "alias": "champion",
}


def _start(kube: Any, namespace: str, example: str = "qwen3-4b-full.yaml") -> str:
    doc = load_example(example, namespace)
    kube.create(doc)
    return str(doc["metadata"]["name"])


def test_pending_training_registering_succeeded(kube: Any, namespace: str, operator: Any) -> None:
    name = _start(kube, namespace)
    ptj = f"{name}-train"
    wait_for(lambda: kube.get("kubeflow.org/v1", "PyTorchJob", namespace, ptj), what="the PyTorchJob")
    obj = wait_phase(kube, namespace, name, "Pending")
    assert condition(obj, "ChildrenReady")["status"] == "True"
    assert obj["status"]["children"] == {
        "checkpointClaim": f"{name}-ckpt",
        "configMap": f"{name}-config",
        "pytorchJob": ptj,
    }

    set_pytorchjob_condition(kube, namespace, ptj, "Created")
    set_pytorchjob_condition(kube, namespace, ptj, "Running")
    obj = wait_phase(kube, namespace, name, "Training")
    assert obj["status"]["startTime"]

    # The trainer reports progress itself; the operator must keep it.
    progress = {"step": 10, "totalSteps": 50, "percent": 20, "loss": 1.25}
    kube.patch(
        API_VERSION, "FineTuneJob", namespace, name, {"status": {"progress": progress}}, subresource="status"
    )

    set_pytorchjob_condition(kube, namespace, ptj, "Succeeded")
    obj = wait_phase(kube, namespace, name, "Registering")
    assert obj["status"]["progress"] == progress
    reg = wait_for(
        lambda: kube.get("batch/v1", "Job", namespace, f"{name}-register"), what="the registration Job"
    )
    container = reg["spec"]["template"]["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in json.dumps(container["resources"])
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"

    finish_registration_job(kube, namespace, f"{name}-register", message=json.dumps(RESULT))
    obj = wait_phase(kube, namespace, name, "Succeeded")
    status = obj["status"]
    assert status["registeredModel"] == {
        "name": "qwen3_4b_assistant",
        "version": "3",
        "uri": "models:/qwen3_4b_assistant/3",
        "alias": "champion",
        "runId": "0a1b2c3d4e5f",  # the run it was logged from
    }
    assert "mlflow" not in status  # the trainer's (kubetune_api.ownership); no trainer ran here
    assert status["progress"] == progress
    assert status["completionTime"]
    assert condition(obj, "Ready") | {"lastTransitionTime": None} == {
        "type": "Ready",
        "status": "True",
        "reason": "Succeeded",
        "message": "registered model qwen3_4b_assistant version 3",
        "lastTransitionTime": None,
        "observedGeneration": 1,
    }
    reasons = wait_for(
        lambda: (
            {e["reason"] for e in events_for(kube, namespace, name)} >= {"TrainingStarted", "Succeeded"}
            and {e["reason"] for e in events_for(kube, namespace, name)}
        ),
        what="events",
    )
    assert {"Created", "TrainingStarted", "RegistrationStarted", "Succeeded"} <= reasons


def _trained(kube: Any, namespace: str, name: str) -> tuple[str, str]:
    """Training Succeeded and the registration Job created: (PyTorchJob name, registration Job name)."""
    ptj, reg = f"{name}-train", f"{name}-register"
    wait_for(lambda: kube.get("kubeflow.org/v1", "PyTorchJob", namespace, ptj), what="the PyTorchJob")
    set_pytorchjob_condition(kube, namespace, ptj, "Succeeded")
    wait_for(lambda: kube.get("batch/v1", "Job", namespace, reg), what="the registration Job")
    return ptj, reg


def _registration_changed(kube: Any, namespace: str, name: str, **fields: Any) -> dict[str, Any]:
    """spec.registration fields changed, and the change observed (so a pass ran after whatever the
    test did before); the FineTuneJob then."""
    kube.patch(API_VERSION, "FineTuneJob", namespace, name, {"spec": {"registration": fields}})
    generation = get_job(kube, namespace, name)["metadata"]["generation"]
    return wait_for(
        lambda: (
            (o := get_job(kube, namespace, name)).get("status", {}).get("observedGeneration") == generation
            and o
        ),
        what="the change observed",
    )


def _set_registration(kube: Any, namespace: str, name: str, enabled: bool) -> dict[str, Any]:
    return _registration_changed(kube, namespace, name, enabled=enabled)


def _registers_without_training(
    kube: Any, namespace: str, name: str, training_uid: str, event: str, *, ready: bool = False
) -> None:
    """Registering again (its event emitted) with the same PyTorchJob, then Succeeded with the model."""
    ptj, reg = f"{name}-train", f"{name}-register"
    obj = wait_phase(kube, namespace, name, "Registering")
    assert "completionTime" not in obj["status"]
    # training is not redone: the same PyTorchJob
    assert kube.get("kubeflow.org/v1", "PyTorchJob", namespace, ptj)["metadata"]["uid"] == training_uid
    wait_for(
        lambda: [e for e in events_for(kube, namespace, name) if e["reason"] == event],
        what=f"a {event} event",
    )
    finish_registration_job(kube, namespace, reg, message=json.dumps(RESULT))
    obj = wait_phase(kube, namespace, name, "Succeeded")
    assert obj["status"]["registeredModel"]["version"] == RESULT["version"]
    assert obj["status"].get("completionTime")
    if ready:
        assert condition(obj, "Ready")["status"] == "True"


def _succeed(kube: Any, namespace: str, name: str) -> dict[str, Any]:
    ptj = f"{name}-train"
    wait_for(lambda: kube.get("kubeflow.org/v1", "PyTorchJob", namespace, ptj), what="the PyTorchJob")
    set_pytorchjob_condition(kube, namespace, ptj, "Succeeded")
    wait_for(lambda: kube.get("batch/v1", "Job", namespace, f"{name}-register"), what="the registration Job")
    finish_registration_job(kube, namespace, f"{name}-register", message=json.dumps(RESULT))
    return wait_phase(kube, namespace, name, "Succeeded")


def _alias_jobs(kube: Any, namespace: str, name: str) -> list[dict[str, Any]]:
    selector = f"kubetune.io/job={name},app.kubernetes.io/component=alias"
    return list(kube.list("batch/v1", "Job", namespace, selector))


def _alias_reason(kube: Any, namespace: str, name: str) -> str | None:
    """The AliasSynced condition's reason, None while there is none."""
    obj = get_job(kube, namespace, name)
    found = [c for c in obj.get("status", {}).get("conditions") or [] if c["type"] == "AliasSynced"]
    return found[0]["reason"] if found else None


def _alias_in_status(kube: Any, namespace: str, name: str, alias: str, what: str) -> dict[str, Any]:
    """Wait until the status says the registered model carries ``alias``; the FineTuneJob then."""
    obj: dict[str, Any] = wait_for(
        lambda: (o := get_job(kube, namespace, name))["status"]["registeredModel"]["alias"] == alias and o,
        what=what,
    )
    return obj


def _second_alias_job(
    kube: Any, namespace: str, name: str, first: dict[str, Any], what: str
) -> dict[str, Any]:
    """Wait for a second alias Job beside ``first``; it must move the alias to champion."""
    jobs = wait_for(
        lambda: len(_alias_jobs(kube, namespace, name)) == 2 and _alias_jobs(kube, namespace, name), what=what
    )
    second: dict[str, Any] = next(j for j in jobs if j["metadata"]["name"] != first["metadata"]["name"])
    assert second["metadata"]["annotations"]["kubetune.io/alias"] == "champion"
    return second


def test_an_alias_changed_after_success_is_moved_by_a_registration_rerun(
    kube: Any, namespace: str, operator: Any, control_plane: Any
) -> None:
    name = _start(kube, namespace)
    obj = _succeed(kube, namespace, name)
    assert obj["status"]["registeredModel"]["alias"] == "champion" and not _alias_jobs(kube, namespace, name)

    kube.patch(
        API_VERSION, "FineTuneJob", namespace, name, {"spec": {"registration": {"alias": "production"}}}
    )
    jobs = wait_for(lambda: _alias_jobs(kube, namespace, name), what="the alias Job")
    assert len(jobs) == 1
    job = jobs[0]
    # the registration command again (idempotent: it finds the version and moves the alias), no GPU
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][:3] == ["python", "-m", "kubetune_trainer.register"]
    assert "nvidia.com/gpu" not in json.dumps(container["resources"])
    assert job["metadata"]["annotations"]["kubetune.io/alias"] == "production"
    # the API server kept the TTL: Kubernetes deletes the finished Job after a day
    assert job["spec"]["ttlSecondsAfterFinished"] == 86400
    # the trainer config it reads carries the new alias
    wait_for(
        lambda: (
            "alias: production"
            in kube.get("v1", "ConfigMap", namespace, f"{name}-config")["data"]["config.yaml"]
        ),
        what="the new alias in the trainer config",
    )
    wait_for(
        lambda: _alias_reason(kube, namespace, name) == "MovingAlias", what="AliasSynced=False, MovingAlias"
    )
    obj = get_job(kube, namespace, name)
    assert obj["status"]["phase"] == "Succeeded" and obj["status"]["registeredModel"]["alias"] == "champion"

    finish_registration_job(
        kube, namespace, job["metadata"]["name"], message=json.dumps({**RESULT, "alias": "production"})
    )
    obj = _alias_in_status(kube, namespace, name, "production", "the moved alias in the status")
    assert obj["status"]["phase"] == "Succeeded" and obj["status"]["registeredModel"]["version"] == "3"
    assert condition(obj, "AliasSynced")["status"] == "True"
    assert condition(obj, "Ready")["status"] == "True"
    wait_for(
        lambda: {"MovingAlias", "AliasMoved"} <= {e["reason"] for e in events_for(kube, namespace, name)},
        what="MovingAlias and AliasMoved events",
    )

    # Back to the first alias: a new Job (a finished one of an earlier change is never taken for it).
    kube.patch(API_VERSION, "FineTuneJob", namespace, name, {"spec": {"registration": {"alias": "champion"}}})
    jobs = wait_for(
        lambda: len(_alias_jobs(kube, namespace, name)) == 2 and _alias_jobs(kube, namespace, name)
    )
    newest = next(j for j in jobs if j["metadata"]["name"] != job["metadata"]["name"])
    finish_registration_job(
        kube,
        namespace,
        newest["metadata"]["name"],
        exit_code=1,
        message='{"error": "MLflow refused", "reason": "MlflowRefused"}',
    )
    wait_for(
        lambda: _alias_reason(kube, namespace, name) == "AliasFailed", what="AliasSynced=False, AliasFailed"
    )
    obj = get_job(kube, namespace, name)
    # the model stays registered and Succeeded; the failure is said, with what MLflow answered
    assert obj["status"]["phase"] == "Succeeded" and obj["status"]["registeredModel"]["alias"] == "production"
    assert "MLflow refused" in condition(obj, "AliasSynced")["message"]

    # the documented remedy (docs/troubleshooting.md): fix what MLflow refused, delete the failed Job;
    # the operator, which watches its alias Jobs, creates it again at once (not at the next re-sync)
    failed_uid = newest["metadata"]["uid"]
    control_plane.kubectl("delete", "job", "-n", namespace, newest["metadata"]["name"], "--wait=false")
    again = wait_for(
        lambda: (
            (j := kube.get("batch/v1", "Job", namespace, newest["metadata"]["name"]))
            and j["metadata"]["uid"] != failed_uid
            and j
        ),
        what="the alias Job created again",
    )
    assert again["metadata"]["annotations"]["kubetune.io/alias"] == "champion"


def test_failed_training(kube: Any, namespace: str, operator: Any) -> None:
    name = _start(kube, namespace)
    ptj = f"{name}-train"
    wait_for(lambda: kube.get("kubeflow.org/v1", "PyTorchJob", namespace, ptj), what="the PyTorchJob")
    set_pytorchjob_condition(kube, namespace, ptj, "Running")
    wait_phase(kube, namespace, name, "Training")
    set_pytorchjob_condition(
        kube, namespace, ptj, "Failed", "PyTorchJob has failed because 1 Master replica(s) failed."
    )
    obj = wait_phase(kube, namespace, name, "Failed")
    ready = condition(obj, "Ready")
    assert ready["status"] == "False"
    assert ready["reason"] == "TrainingFailed"
    assert "1 Master replica(s) failed" in ready["message"]
    assert f"kubectl logs -n {namespace} -l training.kubeflow.org/job-name={ptj}" in ready["message"]
    assert kube.get("batch/v1", "Job", namespace, f"{name}-register") is None
    wait_for(
        lambda: [
            e
            for e in events_for(kube, namespace, name)
            if e["reason"] == "TrainingFailed" and e["type"] == "Warning"
        ],
        what="a TrainingFailed warning event",
    )
    # a spec change on a failed job changes nothing, and the status says it was seen
    kube.patch(API_VERSION, "FineTuneJob", namespace, name, {"spec": {"suspend": True}})
    obj = wait_for(
        lambda: (o := get_job(kube, namespace, name)).get("status", {}).get("observedGeneration") == 2 and o,
        what="observedGeneration 2 on the failed job",
    )
    assert obj["status"]["phase"] == "Failed" and condition(obj, "Ready")["reason"] == "TrainingFailed"


def test_failed_registration_and_its_retry(
    kube: Any, namespace: str, operator: Any, control_plane: Any
) -> None:
    name = _start(kube, namespace)
    ptj, _ = _trained(kube, namespace, name)
    finish_registration_job(
        kube,
        namespace,
        f"{name}-register",
        exit_code=1,
        message="mlflow.exceptions.MlflowException: 401 Unauthorized",
    )
    obj = wait_phase(kube, namespace, name, "Failed")
    ready = condition(obj, "Ready")
    assert ready["reason"] == "RegistrationFailed"
    assert "401 Unauthorized" in ready["message"]
    assert "BackoffLimitExceeded" in ready["message"]
    assert "registeredModel" not in obj["status"]
    wait_for(
        lambda: [e for e in events_for(kube, namespace, name) if e["reason"] == "RegistrationFailed"],
        what="a RegistrationFailed event",
    )
    assert f"{RETRY}=" in ready["message"]
    reg = f"{name}-register"
    failed_uid = kube.get("batch/v1", "Job", namespace, reg)["metadata"]["uid"]
    training_uid = kube.get("kubeflow.org/v1", "PyTorchJob", namespace, ptj)["metadata"]["uid"]
    # The status's remedy: credentials fixed, the annotation set; the operator deletes the failed
    # Job itself and registers the trained model again, without training.
    _ask_retry(kube, namespace, name, "1")
    wait_for(
        lambda: (j := kube.get("batch/v1", "Job", namespace, reg)) and j["metadata"]["uid"] != failed_uid,
        what="the registration Job created anew",
    )
    _registers_without_training(kube, namespace, name, training_uid, "RegistrationRetried", ready=True)
    assert get_job(kube, namespace, name)["status"]["registrationRetry"] == "1"


def _ask_retry(kube: Any, namespace: str, name: str, value: str) -> None:
    kube.patch(API_VERSION, "FineTuneJob", namespace, name, {"metadata": {"annotations": {RETRY: value}}})


def test_a_failed_registration_job_deleted_by_a_ttl_is_not_retried(
    kube: Any, namespace: str, operator: Any, control_plane: Any
) -> None:
    """An admission policy that gives every Job a TTL deletes the failed Job: were that the retry,
    a failed registration would be retried forever. Only the annotation retries."""
    name = _start(kube, namespace)
    _, reg = _trained(kube, namespace, name)
    finish_registration_job(kube, namespace, reg, exit_code=1, message="MlflowException: 401 Unauthorized")
    wait_phase(kube, namespace, name, "Failed")
    control_plane.kubectl("delete", "job", "-n", namespace, reg, "--wait=false")
    wait_for(lambda: kube.get("batch/v1", "Job", namespace, reg) is None, what="the failed Job gone")
    obj = _registration_changed(kube, namespace, name, alias="candidate")
    assert obj["status"]["phase"] == "Failed" and condition(obj, "Ready")["reason"] == "RegistrationFailed"
    assert kube.get("batch/v1", "Job", namespace, reg) is None  # not created again
    # asked: the Job is created again; a value already acted on asks nothing
    _ask_retry(kube, namespace, name, "2026-12-02T06:30:00Z")
    wait_for(lambda: kube.get("batch/v1", "Job", namespace, reg), what="the registration Job created again")
    finish_registration_job(kube, namespace, reg, exit_code=1, message="MlflowException: 401 Unauthorized")
    obj = wait_phase(kube, namespace, name, "Failed")
    assert obj["status"]["registrationRetry"] == "2026-12-02T06:30:00Z"
    control_plane.kubectl("delete", "job", "-n", namespace, reg, "--wait=false")
    wait_for(lambda: kube.get("batch/v1", "Job", namespace, reg) is None, what="the failed Job gone again")
    obj = _registration_changed(kube, namespace, name, alias="champion")
    assert obj["status"]["phase"] == "Failed" and kube.get("batch/v1", "Job", namespace, reg) is None


def test_registration_turned_off_while_its_job_runs(
    kube: Any, namespace: str, operator: Any, control_plane: Any
) -> None:
    name = _start(kube, namespace)
    _, reg = _trained(kube, namespace, name)
    wait_phase(kube, namespace, name, "Registering")
    # Turned off while the Job runs: the Job still registers, so the job must not claim to be done.
    obj = _set_registration(kube, namespace, name, enabled=False)
    assert obj["status"]["phase"] == "Registering"
    assert "turned off after it was created" in condition(obj, "Registered")["message"]
    finish_registration_job(kube, namespace, reg, message=json.dumps(RESULT))
    obj = wait_phase(kube, namespace, name, "Succeeded")
    assert obj["status"]["registeredModel"]["version"] == RESULT["version"]


def test_registration_turned_off_and_its_pod_skips(kube: Any, namespace: str, operator: Any) -> None:
    name = _start(kube, namespace)
    _, reg = _trained(kube, namespace, name)
    _set_registration(kube, namespace, name, enabled=False)
    # the pod read the updated trainer config: it ends without registering, and says so
    finish_registration_job(
        kube, namespace, reg, message=json.dumps({"skipped": "registration.enabled is false"})
    )
    obj = wait_phase(kube, namespace, name, "Succeeded")
    assert condition(obj, "Registered")["reason"] == "RegistrationDisabled"
    assert "ended without registering" in condition(obj, "Registered")["message"]
    assert "registeredModel" not in obj["status"]


def test_registration_turned_off_then_failed_finishes_without_registering(
    kube: Any, namespace: str, operator: Any, control_plane: Any
) -> None:
    name = _start(kube, namespace)
    _, reg = _trained(kube, namespace, name)
    _set_registration(kube, namespace, name, enabled=False)
    finish_registration_job(kube, namespace, reg, exit_code=1, message="MlflowException: 401 Unauthorized")
    obj = wait_phase(kube, namespace, name, "Failed")
    assert "to finish without registering" in condition(obj, "Ready")["message"]
    # the remedy: the annotation; with registration off the operator deletes the failed Job, and
    # nothing is registered or retried
    _ask_retry(kube, namespace, name, "1")
    obj = wait_phase(kube, namespace, name, "Succeeded")
    assert condition(obj, "Registered")["reason"] == "RegistrationDisabled"
    assert "registeredModel" not in obj["status"] and obj["status"].get("completionTime")
    assert kube.get("batch/v1", "Job", namespace, reg) is None
    # the pass's events go out in order after its status write: once its Succeeded event is there,
    # a RegistrationRetried of the same pass would be too
    reasons = wait_for(
        lambda: (r := [e["reason"] for e in events_for(kube, namespace, name)]) and "Succeeded" in r and r,
        what="the Succeeded event",
    )
    assert "RegistrationRetried" not in reasons


def test_registration_turned_on_after_training_without_it(kube: Any, namespace: str, operator: Any) -> None:
    name = _start(kube, namespace)
    ptj, reg = f"{name}-train", f"{name}-register"
    wait_for(lambda: kube.get("kubeflow.org/v1", "PyTorchJob", namespace, ptj), what="the PyTorchJob")
    _set_registration(kube, namespace, name, enabled=False)
    training_uid = kube.get("kubeflow.org/v1", "PyTorchJob", namespace, ptj)["metadata"]["uid"]
    set_pytorchjob_condition(kube, namespace, ptj, "Succeeded")
    obj = wait_phase(kube, namespace, name, "Succeeded")
    assert condition(obj, "Registered")["reason"] == "RegistrationDisabled"
    assert kube.get("batch/v1", "Job", namespace, reg) is None
    # turned on later: the trained model is registered, without training again
    _set_registration(kube, namespace, name, enabled=True)
    wait_for(lambda: kube.get("batch/v1", "Job", namespace, reg), what="the registration Job")
    _registers_without_training(kube, namespace, name, training_uid, "RegistrationEnabled")


def test_a_pytorchjob_deleted_after_it_succeeded_is_not_created_again(
    kube: Any, namespace: str, operator: Any, control_plane: Any
) -> None:
    name = _start(kube, namespace)
    ptj, reg = _trained(kube, namespace, name)
    wait_phase(kube, namespace, name, "Registering")
    # deleted while the model registers (by hand, or by a TTL): training must not start again
    control_plane.kubectl("delete", "pytorchjob", "-n", namespace, ptj, "--wait=false")
    wait_for(
        lambda: kube.get("kubeflow.org/v1", "PyTorchJob", namespace, ptj) is None, what="the PyTorchJob gone"
    )
    # a pass after the deletion, for sure: a spec change it must observe (a pass creates children
    # before it writes the status)
    kube.patch(
        API_VERSION, "FineTuneJob", namespace, name, {"spec": {"registration": {"alias": "candidate"}}}
    )
    generation = get_job(kube, namespace, name)["metadata"]["generation"]
    obj = wait_for(
        lambda: (o := get_job(kube, namespace, name))["status"].get("observedGeneration") == generation and o,
        what="the change observed",
    )
    assert kube.get("kubeflow.org/v1", "PyTorchJob", namespace, ptj) is None
    assert obj["status"]["phase"] == "Registering"
    assert condition(obj, "Training")["reason"] == "TrainingSucceeded"
    finish_registration_job(kube, namespace, reg, message=json.dumps(RESULT))
    obj = wait_phase(kube, namespace, name, "Succeeded")
    assert obj["status"]["registeredModel"]["version"] == RESULT["version"]
    assert kube.get("kubeflow.org/v1", "PyTorchJob", namespace, ptj) is None
    created = [
        e for e in events_for(kube, namespace, name) if e.get("message") == f"created PyTorchJob {ptj}"
    ]
    assert sum(int(e.get("count") or 1) for e in created) == 1


def test_suspend_and_resume(kube: Any, namespace: str, operator: Any) -> None:
    name = _start(kube, namespace)
    ptj = f"{name}-train"
    wait_for(lambda: kube.get("kubeflow.org/v1", "PyTorchJob", namespace, ptj), what="the PyTorchJob")
    set_pytorchjob_condition(kube, namespace, ptj, "Running")
    wait_phase(kube, namespace, name, "Training")

    kube.patch(API_VERSION, "FineTuneJob", namespace, name, {"spec": {"suspend": True}})
    wait_for(
        lambda: (
            kube.get("kubeflow.org/v1", "PyTorchJob", namespace, ptj)["spec"]["runPolicy"]["suspend"] is True
        ),
        what="runPolicy.suspend true",
    )
    obj = wait_phase(kube, namespace, name, "Suspended")
    assert condition(obj, "Suspended")["status"] == "True"
    set_pytorchjob_condition(kube, namespace, ptj, "Suspended")

    kube.patch(API_VERSION, "FineTuneJob", namespace, name, {"spec": {"suspend": False}})
    wait_for(
        lambda: (
            kube.get("kubeflow.org/v1", "PyTorchJob", namespace, ptj)["spec"]["runPolicy"]["suspend"] is False
        ),
        what="runPolicy.suspend false",
    )
    wait_phase(kube, namespace, name, "Pending")
    set_pytorchjob_condition(kube, namespace, ptj, "Running")
    obj = wait_phase(kube, namespace, name, "Training")
    assert condition(obj, "Suspended")["status"] == "False"
    assert get_job(kube, namespace, name)["metadata"]["generation"] == 3
    assert obj["status"]["observedGeneration"] == 3

    # The alias may change at any time; the registration step reads it from the trainer config.
    kube.patch(
        API_VERSION, "FineTuneJob", namespace, name, {"spec": {"registration": {"alias": "candidate"}}}
    )
    wait_for(
        lambda: (
            "alias: candidate"
            in kube.get("v1", "ConfigMap", namespace, f"{name}-config")["data"]["config.yaml"]
        ),
        what="the new alias in the trainer config",
    )


def test_delete_releases_the_finalizer_and_keeps_a_kept_pvc(kube: Any, namespace: str, operator: Any) -> None:
    doc = load_example("qwen3-4b-full.yaml", namespace)
    doc["spec"]["storage"]["keepOnDelete"] = True
    kube.create(doc)
    name = doc["metadata"]["name"]
    wait_for(
        lambda: kube.get("kubeflow.org/v1", "PyTorchJob", namespace, f"{name}-train"), what="the PyTorchJob"
    )
    obj = wait_for(
        lambda: (o := get_job(kube, namespace, name))["metadata"].get("finalizers") and o, what="finalizer"
    )
    assert obj["metadata"]["finalizers"] == ["kubetune.io/finalizer"]
    pvc = kube.get("v1", "PersistentVolumeClaim", namespace, f"{name}-ckpt")
    assert "ownerReferences" not in pvc["metadata"]  # the garbage collector will leave it alone
    ptj = kube.get("kubeflow.org/v1", "PyTorchJob", namespace, f"{name}-train")
    assert ptj["metadata"]["ownerReferences"][0]["uid"] == obj["metadata"]["uid"]  # ... and delete this

    kube.request("DELETE", f"/apis/{API_VERSION}/namespaces/{namespace}/finetunejobs/{name}")
    wait_for(lambda: kube.get(API_VERSION, "FineTuneJob", namespace, name) is None, what="the job to be gone")


@pytest.fixture
def events_only_operator(
    operator_env: dict[str, str], namespace: str, monkeypatch: pytest.MonkeyPatch
) -> Any:
    """The operator with its retries and re-sync an hour away: only watch events can move a job on."""
    from tests.integration.conftest import kopf_runner

    monkeypatch.setenv("KUBETUNE_RETRY_SECONDS", "3600")
    with kopf_runner(namespace) as runner:
        yield runner


def test_every_child_the_operator_follows_is_watched(
    kube: Any, namespace: str, events_only_operator: Any
) -> None:
    """The PyTorchJob, the registration Job and the alias Job each move the status by their watch
    events alone (no retry, no re-sync within the test): each child kind is inside the server-side
    label selector of its watch; and a spec change kopf's diff cannot see is still acted on."""
    name = _start(kube, namespace)
    _succeed(kube, namespace, name)
    kube.patch(
        API_VERSION, "FineTuneJob", namespace, name, {"spec": {"registration": {"alias": "production"}}}
    )
    job = wait_for(lambda: _alias_jobs(kube, namespace, name), what="the alias Job")[0]
    finish_registration_job(
        kube, namespace, job["metadata"]["name"], message=json.dumps({**RESULT, "alias": "production"})
    )
    obj = _alias_in_status(
        kube, namespace, name, "production", "the moved alias in the status, from the alias Job's watch event"
    )
    assert condition(obj, "AliasSynced")["status"] == "True"

    # Back to the first alias while the change handler of "production" still waits for its retry
    # (an hour away): kopf sees the spec it last handled and runs nothing, the generation was never
    # observed, so the operator reconciles it anyway and moves the alias back.
    kube.patch(API_VERSION, "FineTuneJob", namespace, name, {"spec": {"registration": {"alias": "champion"}}})
    newest = _second_alias_job(kube, namespace, name, job, "a second alias Job for the reverted alias")
    finish_registration_job(kube, namespace, newest["metadata"]["name"], message=json.dumps(RESULT))
    obj = _alias_in_status(kube, namespace, name, "champion", "the alias moved back in the status")
    assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"]


def test_an_alias_changed_back_while_its_move_runs_ends_where_the_spec_says(
    kube: Any, namespace: str, events_only_operator: Any
) -> None:
    """production, then champion again while production's Job still runs: the champion move waits
    for it, then runs, so MLflow and the status end on champion (events alone, no retries)."""
    name = _start(kube, namespace)
    _succeed(kube, namespace, name)
    kube.patch(
        API_VERSION, "FineTuneJob", namespace, name, {"spec": {"registration": {"alias": "production"}}}
    )
    first = wait_for(lambda: _alias_jobs(kube, namespace, name), what="the production alias Job")[0]
    kube.patch(API_VERSION, "FineTuneJob", namespace, name, {"spec": {"registration": {"alias": "champion"}}})
    obj = wait_for(
        lambda: (
            (o := get_job(kube, namespace, name))["status"].get("observedGeneration") == 3
            and "'champion'" in condition(o, "AliasSynced")["message"]
            and o
        ),
        what="AliasSynced pointing at champion, generation 3 observed",
    )
    assert condition(obj, "AliasSynced")["reason"] == "MovingAlias"
    assert [j["metadata"]["name"] for j in _alias_jobs(kube, namespace, name)] == [first["metadata"]["name"]]

    # production's Job ends (MLflow says production now); then, and only then, the champion move
    finish_registration_job(
        kube, namespace, first["metadata"]["name"], message=json.dumps({**RESULT, "alias": "production"})
    )
    second = _second_alias_job(
        kube, namespace, name, first, "the champion alias Job after production's ended"
    )
    finish_registration_job(kube, namespace, second["metadata"]["name"], message=json.dumps(RESULT))
    obj = wait_for(
        lambda: (
            (o := get_job(kube, namespace, name)) and condition(o, "AliasSynced")["status"] == "True" and o
        ),
        what="AliasSynced True",
    )
    assert obj["status"]["registeredModel"]["alias"] == "champion"
    assert "'champion'" in condition(obj, "AliasSynced")["message"]
