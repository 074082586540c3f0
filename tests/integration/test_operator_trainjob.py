"""A job on Kubeflow Trainer v2 (issue 31 item 2), through the real API server with Trainer v2.2.0's
real CRDs (TrainJob, TrainingRuntime, ClusterTrainingRuntime: ``tests.support.trainer_crds``) and the
operator: it creates the job's own TrainingRuntime and its TrainJob (owned, labelled, nothing pruned
by the real schema), follows the TrainJob's status to the registration Job and Succeeded, explains a
failure from the failed pod's ``node`` container, and suspends and resumes through the TrainJob's
``spec.suspend``; Kueue's queue label reaches the TrainJob and its hold reads as queued.

No Trainer controller runs here: the test plays its part as Trainer v2.2 does (conditions
``Suspended``/``Complete``/``Failed`` with the JobSet's reasons, ``jobsStatus`` of the ``node``
step), as the other integration tests play the Training Operator's for a PyTorchJob. Trainer's and
JobSet's webhooks do not run either (their checks: tests/cluster, issue 31 item 4). ``kubetune render``
of a job on TrainJob is accepted by the same CRDs (issue 31 item 5)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.integration.conftest import (
    condition,
    finish_registration_job,
    get_job,
    load_example,
    now,
    wait_for,
    wait_phase,
)
from tests.support.controlplane import ControlPlane
from tests.support.render_check import dry_run, not_kept, render_example
from tests.support.trainer_crds import CRD_FILES

from kubetune_api.engines import Engine
from kubetune_api.failures import Failure, TrainingFailure
from kubetune_api.spec import parse_job
from kubetune_operator import builders, observations
from kubetune_operator.settings import Settings

pytestmark = pytest.mark.integration

TJ = Engine.TRAINJOB
API = TJ.api_version
RESULT = {"name": "qwen3_4b_assistant", "version": "1", "uri": "models:/qwen3_4b_assistant/1", "run_id": "r1"}


def _served(kube: Any) -> bool:
    return observations.serves(kube.resources(API), TJ.plural)


@pytest.fixture(scope="module")
def trainer_crds(control_plane: ControlPlane, trainer_crd_dir: Path, kube: Any) -> Iterator[None]:
    """Trainer v2.2.0's CRDs installed for this module (server-side: they are too large for the
    last-applied annotation), removed after it (other tests need TrainJob not served)."""
    files = [arg for name in CRD_FILES for arg in ("-f", str(trainer_crd_dir / name))]
    control_plane.kubectl("apply", "--server-side", *files)
    wait_for(lambda: _served(kube) and kube.resources(API), what="trainjobs served")
    wait_for(
        lambda: {"trainingruntimes", "trainjobs"} <= {r["name"] for r in kube.resources(API)["resources"]},
        what="trainingruntimes served",
    )
    yield
    control_plane.kubectl("delete", "--ignore-not-found", "--wait=true", *files, check=False)
    wait_for(lambda: not _served(kube), what="trainjobs no longer served")


def _create(kube: Any, namespace: str, **spec: Any) -> tuple[str, dict[str, Any]]:
    doc = load_example("qwen3-4b-full.yaml", namespace)
    doc["spec"].update({"engine": "TrainJob", **spec})
    kube.create(doc)
    return str(doc["metadata"]["name"]), doc


def _trainer_status(
    kube: Any, namespace: str, name: str, *conditions: tuple[str, str, str, str], active: int = 0
) -> None:
    """Play Trainer v2.2: the TrainJob's conditions (type, status, reason, message) and the
    ``node`` step's jobsStatus (``active`` Jobs, all ready while active)."""
    status = {
        "conditions": [
            {"type": t, "status": s, "reason": r, "message": m, "lastTransitionTime": now()}
            for t, s, r, m in conditions
        ],
        "jobsStatus": [
            {"name": "node", "active": active, "ready": active, "succeeded": 0, "failed": 0, "suspended": 0}
        ],
    }
    kube.patch(API, "TrainJob", namespace, name, {"status": status}, subresource="status")


def test_trainjob_job_is_created_runs_and_registers(
    kube: Any, namespace: str, trainer_crds: None, operator: Any
) -> None:
    name, doc = _create(kube, namespace)
    tj = f"{name}-train"
    live = wait_for(lambda: kube.get(API, "TrainJob", namespace, tj), what="the TrainJob")
    runtime = kube.get(API, "TrainingRuntime", namespace, tj)
    assert kube.get("kubeflow.org/v1", "PyTorchJob", namespace, tj) is None  # never the other engine
    job = get_job(kube, namespace, name)
    for obj in (live, runtime):
        (ref,) = obj["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == (
            "FineTuneJob",
            name,
            job["metadata"]["uid"],
            True,
        )
        assert obj["metadata"]["labels"][builders.LABEL_JOB] == name
    # the real schema kept all of it: the runtime's JobSet template (the pods: container node, the
    # checkpoint volume, restartPolicy Never, the exit-code failure policy) and the TrainJob
    settings = Settings.from_env()
    typed = parse_job({**doc, "metadata": job["metadata"]})
    built_runtime, built_trainjob = builders.build_training(TJ, typed, settings)
    assert not_kept(runtime["spec"], built_runtime["spec"]) == []
    assert not_kept(live["spec"], built_trainjob["spec"]) == []
    assert live["spec"]["runtimeRef"] == {"name": tj, "apiGroup": TJ.group, "kind": "TrainingRuntime"}
    (step,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    pod = step["template"]["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["node"] and pod["restartPolicy"] == "Never"
    claims = [v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v]
    assert f"{name}-ckpt" in claims
    assert step["template"]["spec"]["podFailurePolicy"]["rules"][0]["onExitCodes"]["containerName"] == "node"

    obj = wait_phase(kube, namespace, name, "Pending")
    assert obj["status"]["engine"] == "TrainJob"
    assert obj["status"]["children"] == {
        "checkpointClaim": f"{name}-ckpt",
        "configMap": f"{name}-config",
        "trainJob": tj,
    }
    assert condition(obj, "ChildrenReady")["status"] == "True"
    waiting = wait_for(
        lambda: (
            condition(get_job(kube, namespace, name), "Training")["reason"] == "WaitingForTrainingOperator"
            and condition(get_job(kube, namespace, name), "Training")
        ),
        what="waiting for the Trainer",
    )
    assert "TrainJob" in waiting["message"] and "Kubeflow Trainer v2" in waiting["message"]

    _trainer_status(kube, namespace, tj, active=1)  # never suspended: no condition, its Job active
    wait_phase(kube, namespace, name, "Training")
    _trainer_status(
        kube, namespace, tj, ("Complete", "True", "AllJobsCompleted", "jobset completed successfully")
    )
    wait_phase(kube, namespace, name, "Registering")
    wait_for(lambda: kube.get("batch/v1", "Job", namespace, f"{name}-register"), what="the registration Job")
    finish_registration_job(kube, namespace, f"{name}-register", message=json.dumps(RESULT))
    obj = wait_phase(kube, namespace, name, "Succeeded")
    assert obj["status"]["registeredModel"]["version"] == "1"
    assert condition(obj, "Training")["reason"] == "TrainingSucceeded"


def _failed_pod(kube: Any, namespace: str, tj: str, job_name: str, failure: TrainingFailure) -> str:
    """Play the Job controller and the kubelet: the TrainJob's pod whose ``node`` container exited
    with a permanent code (it stays: restartPolicy Never, the JobSet not restarted)."""
    pod_name = f"{tj}-node-0-0-x7k2p"
    labels = {
        observations.JOBSET_NAME_LABEL: tj,
        "jobset.sigs.k8s.io/replicatedjob-name": "node",
        builders.LABEL_JOB: job_name,
        builders.LABEL_COMPONENT: builders.COMPONENT_TRAINING,
    }
    kube.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod_name, "namespace": namespace, "labels": labels},
            "spec": {"containers": [{"name": "node", "image": "registry.example.com/kubetune/trainer:test"}]},
        }
    )
    terminated = {
        "exitCode": 3,
        "reason": "Error",
        "message": failure.termination_message(),
        "startedAt": now(),
        "finishedAt": now(),
    }
    status = {
        "phase": "Failed",
        "containerStatuses": [
            {
                "name": "node",
                "image": "registry.example.com/kubetune/trainer:test",
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {"terminated": terminated},
            }
        ],
    }
    kube.patch("v1", "Pod", namespace, pod_name, {"status": status}, subresource="status")
    return pod_name


def test_trainjob_failed_with_a_permanent_exit_code_is_explained(
    kube: Any, namespace: str, trainer_crds: None, operator: Any
) -> None:
    name, _ = _create(kube, namespace)
    tj = f"{name}-train"
    wait_for(lambda: kube.get(API, "TrainJob", namespace, tj), what="the TrainJob")
    _trainer_status(kube, namespace, tj, active=1)
    wait_phase(kube, namespace, name, "Training")
    failure = TrainingFailure.of(Failure.DATASET_ERROR, "the dataset has no column 'messages'")
    pod = _failed_pod(kube, namespace, tj, name, failure)
    _trainer_status(
        kube,
        namespace,
        tj,
        (
            "Failed",
            "True",
            "FailJobSetFailurePolicyAction",
            f"jobset failed due to failure policy rule permanentExitCode (first failed job: {tj}-node-0)",
        ),
    )
    obj = wait_phase(kube, namespace, name, "Failed")
    training = condition(obj, "Training")
    assert training["reason"] == Failure.DATASET_ERROR
    assert pod in training["message"] and "no column 'messages'" in training["message"]
    assert f"-l jobset.sigs.k8s.io/jobset-name={tj}" in training["message"]
    assert kube.get(API, "TrainJob", namespace, tj)["spec"]["suspend"] is False  # it ended by itself


def test_trainjob_suspend_and_resume(kube: Any, namespace: str, trainer_crds: None, operator: Any) -> None:
    name, _ = _create(kube, namespace)
    tj = f"{name}-train"
    wait_for(lambda: kube.get(API, "TrainJob", namespace, tj), what="the TrainJob")
    _trainer_status(kube, namespace, tj, active=1)
    wait_phase(kube, namespace, name, "Training")

    kube.patch("kubetune.io/v1alpha1", "FineTuneJob", namespace, name, {"spec": {"suspend": True}})
    live = wait_for(
        lambda: (obj := kube.get(API, "TrainJob", namespace, tj))["spec"].get("suspend") and obj,
        what="TrainJob spec.suspend",
    )
    assert live["metadata"]["annotations"][builders.ANNOTATION_SUSPENDED_BY_US] == "true"
    _trainer_status(kube, namespace, tj, ("Suspended", "True", "Suspended", "TrainJob is suspended"))
    obj = wait_phase(kube, namespace, name, "Suspended")
    assert "the TrainJob is suspended" in condition(obj, "Suspended")["message"]

    kube.patch("kubetune.io/v1alpha1", "FineTuneJob", namespace, name, {"spec": {"suspend": False}})
    live = wait_for(
        lambda: (obj := kube.get(API, "TrainJob", namespace, tj))["spec"].get("suspend") is False and obj,
        what="TrainJob resumed",
    )
    assert builders.ANNOTATION_SUSPENDED_BY_US not in (live["metadata"].get("annotations") or {})
    _trainer_status(kube, namespace, tj, ("Suspended", "False", "Resumed", "TrainJob is resumed"), active=1)
    wait_phase(kube, namespace, name, "Training")


def test_trainjob_held_by_kueue_is_queued(
    kube: Any, namespace: str, trainer_crds: None, operator: Any
) -> None:
    """The queue label reaches the TrainJob; Kueue's hold (its webhook suspends the TrainJob, not
    kubetune) reads as queued, and kubetune does not lift it."""
    name, doc = _create(
        kube,
        namespace,
        resources={
            **load_example("qwen3-4b-full.yaml", namespace)["spec"]["resources"],
            "queueName": "team-a",
        },
    )
    tj = f"{name}-train"
    live = wait_for(lambda: kube.get(API, "TrainJob", namespace, tj), what="the TrainJob")
    assert live["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    kube.patch(API, "TrainJob", namespace, tj, {"spec": {"suspend": True}})  # as Kueue's webhook does
    _trainer_status(kube, namespace, tj, ("Suspended", "True", "Suspended", "TrainJob is suspended"))
    obj = wait_phase(kube, namespace, name, "Pending")
    wait_for(
        lambda: condition(get_job(kube, namespace, name), "Suspended")["reason"] == "Queued", what="Queued"
    )
    assert kube.get(API, "TrainJob", namespace, tj)["spec"]["suspend"] is True
    assert doc["spec"]["resources"]["queueName"] == "team-a" and obj["status"]["engine"] == "TrainJob"


def test_trainjob_flow_with_least_privilege(
    kube: Any,
    control_plane: ControlPlane,
    namespace: str,
    trainer_crds: None,
    operator_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """The operator as a ServiceAccount holding only ``kubetune_operator.rbac``'s rules (the chart's)
    runs a TrainJob job through suspend, resume and registration, and is never denied."""
    from tests.integration.conftest import (
        bind_operator_role,
        denials,
        kopf_runner,
        kubeconfig_for_service_account,
    )

    role_name = f"kubetune-operator-{namespace}"
    bind_operator_role(control_plane, namespace, role_name)
    kubeconfig = kubeconfig_for_service_account(
        control_plane, namespace, "kubetune-operator", tmp_path / "kc"
    )
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    try:
        with kopf_runner(namespace) as runner:
            name, _ = _create(kube, namespace)
            tj = f"{name}-train"
            wait_for(lambda: kube.get(API, "TrainJob", namespace, tj), what="the TrainJob")
            _trainer_status(kube, namespace, tj, active=1)
            wait_phase(kube, namespace, name, "Training")
            kube.patch("kubetune.io/v1alpha1", "FineTuneJob", namespace, name, {"spec": {"suspend": True}})
            wait_for(
                lambda: kube.get(API, "TrainJob", namespace, tj)["spec"].get("suspend"), what="suspended"
            )
            _trainer_status(kube, namespace, tj, ("Suspended", "True", "Suspended", "TrainJob is suspended"))
            wait_phase(kube, namespace, name, "Suspended")
            kube.patch("kubetune.io/v1alpha1", "FineTuneJob", namespace, name, {"spec": {"suspend": False}})
            wait_for(
                lambda: kube.get(API, "TrainJob", namespace, tj)["spec"].get("suspend") is False,
                what="resumed",
            )
            _trainer_status(
                kube,
                namespace,
                tj,
                ("Suspended", "False", "Resumed", "TrainJob is resumed"),
                ("Complete", "True", "AllJobsCompleted", "jobset completed successfully"),
            )
            wait_for(
                lambda: kube.get("batch/v1", "Job", namespace, f"{name}-register"), what="registration Job"
            )
            finish_registration_job(kube, namespace, f"{name}-register", message=json.dumps(RESULT))
            obj = wait_phase(kube, namespace, name, "Succeeded")
        assert obj["status"]["registeredModel"]["version"] == "1"
        assert not denials(runner.output), "\n".join(denials(runner.output))
    finally:
        control_plane.kubectl("delete", "clusterrolebinding", role_name, check=False)
        control_plane.kubectl("delete", "clusterrole", role_name, check=False)


def test_trainjob_pod_not_created_is_explained(
    kube: Any, namespace: str, trainer_crds: None, operator: Any
) -> None:
    """Play JobSet and the Job controller: the Job ``<tj>-node-0`` exists, its pod is refused (a
    ``FailedCreate`` event on the Job), the TrainJob's Job is not active: the job says why."""
    name, _ = _create(kube, namespace)
    tj = f"{name}-train"
    wait_for(lambda: kube.get(API, "TrainJob", namespace, tj), what="the TrainJob")
    step = kube.create(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": f"{tj}-node-0", "namespace": namespace},
            "spec": {
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [
                            {"name": "node", "image": "registry.example.com/kubetune/trainer:test"}
                        ],
                    }
                }
            },
        }
    )
    refusal = f'Error creating: pods "{tj}-node-0-0-q8x2v" is forbidden: exceeded quota: gpu-quota'
    kube.create(
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{tj}-node-0.failedcreate", "namespace": namespace},
            "involvedObject": {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": f"{tj}-node-0",
                "namespace": namespace,
                "uid": step["metadata"]["uid"],
            },
            "reason": "FailedCreate",
            "type": "Warning",
            "message": refusal,
            "firstTimestamp": now(),
            "lastTimestamp": now(),
            "count": 1,
            "source": {"component": "job-controller"},
        }
    )
    _trainer_status(kube, namespace, tj, active=0)  # its Job exists, no pod active

    def shown() -> dict[str, Any] | None:
        c = condition(get_job(kube, namespace, name), "Training")
        return c if c["reason"] == "PodsNotCreated" else None

    training = wait_for(shown, what="Training PodsNotCreated")
    assert f"the Job controller cannot create pod {tj}-node-0-0-q8x2v of TrainJob {tj}" in training["message"]
    assert "exceeded quota: gpu-quota" in training["message"]
    assert get_job(kube, namespace, name)["status"]["phase"] == "Pending"


# --- kubetune render on TrainJob (issue 31 item 5) ---------------------------------------------------------


@pytest.mark.parametrize("example", ["qwen3-4b-full.yaml", "multinode-lora.yaml"])
def test_render_on_trainjob_is_accepted_by_trainers_crds(
    control_plane: ControlPlane, namespace: str, trainer_crds: None, tmp_path: Path, example: str
) -> None:
    """The TrainingRuntime and the TrainJob ``kubetune render`` prints for a job on TrainJob pass the
    real API server's validation under Trainer v2.2.0's real CRDs: ``kubectl apply --dry-run=server
    --validate=strict`` (an unknown or pruned field is an error, every CRD schema rule and CEL rule
    applies), and the server keeps every field as rendered.

    Only the CRDs: Trainer's and JobSet's webhooks (the TrainJob's runtime must exist, ``trainer.env``
    may not set the torch env, the JobSet defaults) need their controllers running, which this
    control plane has not; tests/cluster/test_trainjob_engine.py checks the render against them with the
    real controllers (issue 31 item 5)."""
    rendered = render_example(tmp_path, example, namespace, "TrainJob")
    training = [d for d in rendered if d["kind"] in ("TrainingRuntime", "TrainJob")]
    assert [d["kind"] for d in training] == ["TrainingRuntime", "TrainJob"]
    assert "PyTorchJob" not in [d["kind"] for d in rendered]
    out = dry_run(control_plane.kubectl, namespace, training)
    assert out.returncode == 0, out.stderr
    stored = json.loads(out.stdout)["items"]
    assert [(s["kind"], s["metadata"]["name"]) for s in stored] == [
        (d["kind"], d["metadata"]["name"]) for d in training
    ]
    for built, kept in zip(training, stored, strict=True):
        assert not_kept(kept, built) == [], built["kind"]
    # nothing was created: a dry run
    assert (
        control_plane.kubectl("get", "trainjobs,trainingruntimes", "-n", namespace, "-o", "name").stdout == ""
    )

    # the check has teeth: a field Trainer v2.2 does not know is refused, named
    wrong = json.loads(json.dumps(training))
    wrong[1]["spec"]["trainer"]["numProcsPerNode"] = 1
    out = dry_run(control_plane.kubectl, namespace, wrong)
    assert out.returncode != 0 and 'unknown field "spec.trainer.numProcsPerNode"' in out.stderr, out.stderr
