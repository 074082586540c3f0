"""The Argo CD health check (deploy/argocd/health/finetunejob.lua) on statuses as they really are: the
operator's own state machine (``state.transition``, ``state.alias_transition``) makes them from
observations of the children, and they are merge-patched through the status subresource of a
FineTuneJob on the real API server (the trainer's progress too) and read back from it. The script runs
in gopher-lua with Argo CD's default libraries and with open libraries (tests/support/lua.py); the
verdict must be the same under both. Then the argocd-cm patch and the Applications.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.support.controlplane import REPO, ControlPlane
from tests.support.lua import run_health

from kubetune_api import spec as api
from kubetune_api.failures import Failure, TrainingFailure
from kubetune_api.preparation import PreparationRefusal, Refusal
from kubetune_api.status import BudgetStatus, FineTuneJobStatus, Phase
from kubetune_operator import builders, observations, state, training_failures
from kubetune_operator.kube import Kube

pytestmark = pytest.mark.integration

ARGOCD = REPO / "deploy" / "argocd"
SCRIPT_PATH = ARGOCD / "health" / "finetunejob.lua"
SCRIPT = SCRIPT_PATH.read_text()
HEALTH_KEY = "resource.customizations.health.kubetune.io_FineTuneJob"
NOW = "2026-11-30T10:00:00Z"
INT64_MAX = 2**63 - 1
RESULT = {
    "name": "qwen3_4b_assistant",
    "version": "3",
    "uri": "models:/qwen3_4b_assistant/3",
    "run_id": "abc",
}
REGISTERED_MESSAGE = "Registered model qwen3_4b_assistant version 3"
PROGRESS = {"step": 25, "totalSteps": 50, "percent": 50, "loss": 1.5, "etaSeconds": 600}


def health(obj: dict[str, Any]) -> dict[str, str]:
    """Argo CD's verdict, the same with its default libraries and with open libraries."""
    default = run_health(SCRIPT_PATH, obj)
    assert run_health(SCRIPT_PATH, obj, open_libs=True) == default
    return default


# --- observations, as the operator makes them from the children -----------------------------------------


def _obs(generation: int = 1, **kw: Any) -> state.Observation:
    return state.Observation(
        generation=generation,
        now=NOW,
        namespace="ns",
        pytorchjob_name="job-train",
        registration_job_name="job-register",
        checkpoint_claim="job-ckpt",
        children={"checkpointClaim": "job-ckpt", "configMap": "job-config", "pytorchJob": "job-train"},
        **kw,
    )


def _training(condition: str | None, message: str = "") -> state.TrainingObservation:
    return state.TrainingObservation(
        exists=True, condition=condition, reason=f"PyTorchJob{condition}", message=message
    )


@dataclass(frozen=True)
class Alias:
    """The operator's status write for a Succeeded job whose registration.alias changed."""

    wanted: str
    job: state.RegistrationObservation
    generation: int = 2


PENDING = _obs(training=_training(None))
CREATED = _obs(training=_training("Created"))
RUNNING = _obs(training=_training("Running"))
TRAINED = _training("Succeeded", "PyTorchJob job-train is successfully completed.")
REGISTERING = _obs(training=TRAINED, registration=state.RegistrationObservation(True, "Running"))
REGISTERED = _obs(
    training=TRAINED, registration=state.RegistrationObservation(True, "Complete", "", dict(RESULT))
)
TRAINING_FAILED = _obs(
    training=_training("Failed", "PyTorchJob job-train has failed because 1 Master replica(s) failed.")
)
REGISTRATION_FAILED = _obs(
    training=TRAINED,
    registration=state.RegistrationObservation(True, "Failed", "BackoffLimitExceeded: 401 Unauthorized"),
)
SUSPENDED = _obs(generation=2, suspend=True, training=_training("Suspended"))
CONFLICT = _obs(conflict="PersistentVolumeClaim job-ckpt already exists and is not owned by this FineTuneJob")
PREPARING = _obs(
    preparation=observations.PreparationObservation(True, "Running"), preparation_job_name="job-prepare"
)
REFUSED = _obs(
    preparation=observations.PreparationObservation(
        True,
        "Failed",
        refusal=PreparationRefusal.of(Refusal.MODEL_GATED, "the Hub answered 401 for org/model"),
    ),
    preparation_job_name="job-prepare",
)
PREPARED = _obs(
    preparation=observations.PreparationObservation(True, "Succeeded", report=None),
    preparation_job_name="job-prepare",
    training=_training(None),
)
SCHEDULER = "0/4 nodes are available: 4 node(s) didn't match Pod's node affinity/selector."
PTJ_FAILED = _training("Failed", "PyTorchJob job-train has failed because 1 Master replica(s) failed.")
DISK_FULL = _obs(
    training=PTJ_FAILED,
    failure=TrainingFailure.of(
        Failure.DISK_FULL,
        "pod job-train-master-0: No space left on device on the checkpoint volume",
        step=120,
    ),
)
# the operator's reading of a pod the kubelet killed for memory
OOM_KILLED = _obs(
    training=PTJ_FAILED,
    failure=training_failures.training_failure(
        PTJ_FAILED,
        [
            {
                "metadata": {"name": "job-train-master-0"},
                "spec": {
                    "containers": [
                        {"name": builders.TRAIN_CONTAINER, "resources": {"limits": {"memory": "64Gi"}}}
                    ]
                },
                "status": {
                    "containerStatuses": [
                        {
                            "name": builders.TRAIN_CONTAINER,
                            "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}},
                        }
                    ]
                },
            }
        ],
        builders.TRAIN_CONTAINER,
    ),
)
# the trainer stopped at spec.budget: its report (status.budget), then the operator's passes
BUDGET = BudgetStatus(reached=True, limit="maxDuration 2h", step=300, total_steps=500)
BUDGET_REPORT = {"budget": BUDGET.model_dump(by_alias=True, exclude_none=True)}
BUDGET_REGISTERING = _obs(
    training=TRAINED, budget=BUDGET, registration=state.RegistrationObservation(True, "Running")
)
BUDGET_REGISTERED = _obs(
    training=TRAINED,
    budget=BUDGET,
    registration=state.RegistrationObservation(True, "Complete", "", dict(RESULT)),
)
BUDGET_NOT_REGISTERED = _obs(training=TRAINED, budget=BUDGET, registration_enabled=False)


def _pods(reason: str, message: str, condition: str = "Created") -> state.Observation:
    trouble = observations.PodTrouble(reason, "job-train-master-0", message, since="2026-11-30T09:00:00Z")
    return _obs(training=_training(condition), pods=state.PodsObservation(trouble=trouble))


UNSCHEDULABLE = _pods(state.Reason.UNSCHEDULABLE, SCHEDULER)
WORKER_UNSCHEDULABLE = _pods(state.Reason.UNSCHEDULABLE, SCHEDULER, "Running")
NOT_CREATED = _pods(
    state.Reason.PODS_NOT_CREATED,
    'Error creating: pods "job-train-master-0" is forbidden: no PriorityClass with name x was found',
)
IMAGE_PULL = _pods(state.Reason.IMAGE_PULL_FAILED, "container pytorch (image t:nope): ImagePullBackOff")
MOUNT_FAILED = _pods(
    state.Reason.MOUNT_FAILED,
    'FailedMount: MountVolume.SetUp failed for volume "checkpoints": mount failed: exit status 32',
)
WORKER_MOUNT_FAILED = _pods(
    state.Reason.MOUNT_FAILED, "FailedAttachVolume: Multi-Attach error for volume pvc-123", "Running"
)
FORBIDDEN = _obs(
    child_error=state.ChildError(
        "create", "PersistentVolumeClaim", "job-ckpt", 403, "Forbidden", "exceeded quota: no-pvcs"
    )
)
API_ERROR = _obs(
    child_error=state.ChildError(
        "create", "PyTorchJob", "job-train", 503, "ServiceUnavailable", "try again", attempts=3
    )
)
ALIAS_MOVING = Alias("challenger", state.RegistrationObservation(True, "Running"))
ALIAS_FAILED = Alias(
    "challenger", state.RegistrationObservation(True, "Failed", "BackoffLimitExceeded: 401 Unauthorized")
)

Step = state.Observation | Alias | dict[str, Any]


@pytest.fixture(scope="module")
def kube(api_client: Any) -> Kube:
    return Kube(api_client)


@pytest.fixture
def new_job(kube: Kube, namespace: str) -> Callable[[str], str]:
    def create(name: str) -> str:
        doc = yaml.safe_load((REPO / "examples" / "qwen3-4b-full.yaml").read_text())
        doc["metadata"] = {"name": name, "namespace": namespace}
        kube.create(doc)
        return name

    return create


def drive(kube: Kube, namespace: str, name: str, *steps: Step) -> dict[str, Any]:
    """Apply each step to the stored FineTuneJob (an observation or an alias Job: the operator's status
    write; a dict: the trainer's progress report), then read the object back."""
    for step in steps:
        obj = kube.get(api.API_VERSION, api.KIND, namespace, name)
        assert obj is not None
        previous = FineTuneJobStatus.model_validate(obj.get("status") or {})
        if isinstance(step, dict):
            status = step
        elif isinstance(step, Alias):
            status = state.alias_transition(
                previous, step.wanted, step.job, now=NOW, generation=step.generation
            ).status
        else:
            status = state.transition(previous, step).status
        kube.patch(api.API_VERSION, api.KIND, namespace, name, {"status": status}, subresource="status")
    stored = kube.get(api.API_VERSION, api.KIND, namespace, name)
    assert stored is not None
    return stored


def said_by(ctype: str) -> Callable[[dict[str, Any]], str]:
    """The expected message is the stored condition's message (the operator's words, not the script's)."""

    def message(obj: dict[str, Any]) -> str:
        (c,) = [c for c in obj["status"]["conditions"] if c["type"] == ctype]
        assert c["message"], c
        return str(c["message"])

    return message


def explained_by(ctype: str) -> Callable[[dict[str, Any]], str]:
    """A failed job's expected message: the stored condition's reason, then its message (which a
    training failure's already begins with: then the message alone)."""

    def message(obj: dict[str, Any]) -> str:
        (c,) = [c for c in obj["status"]["conditions"] if c["type"] == ctype]
        reason, text = str(c["reason"]), said_by(ctype)(obj)
        if text == reason or text.startswith((f"{reason} ", f"{reason}:")):
            return text
        return f"{reason}: {text}"

    return message


def registered_and(ctype: str) -> Callable[[dict[str, Any]], str]:
    return lambda obj: f"{REGISTERED_MESSAGE}; {said_by(ctype)(obj)}"


def both(first: str, then: str) -> Callable[[dict[str, Any]], str]:
    return lambda obj: f"{said_by(first)(obj)}; {said_by(then)(obj)}"


# name: (steps, phase stored, health status, health message: literal, or made from the stored object)
SCENARIOS: dict[str, tuple[list[Step], str, str, str | Callable[[dict[str, Any]], str]]] = {
    "pending": ([PENDING], "Pending", "Progressing", said_by("Training")),
    "preparing": ([PREPARING], "Preparing", "Progressing", said_by("Prepared")),
    "refused-by-preparation": ([PREPARING, REFUSED], "Failed", "Degraded", explained_by("Ready")),
    "prepared-then-training": (
        [PREPARING, PREPARED, RUNNING],
        "Training",
        "Progressing",
        said_by("Training"),
    ),
    "created": ([PENDING, CREATED], "Pending", "Progressing", said_by("Training")),
    "training": ([PENDING, RUNNING], "Training", "Progressing", said_by("Training")),
    "training-with-progress": (
        [PENDING, RUNNING, {"progress": PROGRESS}],
        "Training",
        "Progressing",
        "step 25/50 (50%), loss 1.5000, ETA 10 min",
    ),
    "training-large-numbers": (
        [
            PENDING,
            RUNNING,
            {
                "progress": {
                    "step": INT64_MAX,
                    "totalSteps": INT64_MAX,
                    "percent": 100,
                    "loss": 1e30,
                    "etaSeconds": INT64_MAX,
                }
            },
        ],
        "Training",
        "Progressing",
        "step 9.223e+18/9.223e+18 (100%), loss 1.000e+30, ETA 2562047788015215 h",
    ),
    "registering": ([PENDING, RUNNING, REGISTERING], "Registering", "Progressing", said_by("Registered")),
    "succeeded": ([PENDING, RUNNING, REGISTERING, REGISTERED], "Succeeded", "Healthy", REGISTERED_MESSAGE),
    "alias-moving": (
        [PENDING, RUNNING, REGISTERING, REGISTERED, ALIAS_MOVING],
        "Succeeded",
        "Healthy",
        registered_and("AliasSynced"),
    ),
    "alias-failed-to-move": (
        [PENDING, RUNNING, REGISTERING, REGISTERED, ALIAS_FAILED],
        "Succeeded",
        "Degraded",
        registered_and("AliasSynced"),
    ),
    "training-failed": ([PENDING, RUNNING, TRAINING_FAILED], "Failed", "Degraded", explained_by("Ready")),
    "registration-failed": (
        [PENDING, RUNNING, REGISTRATION_FAILED],
        "Failed",
        "Degraded",
        explained_by("Ready"),
    ),
    "suspended": ([PENDING, RUNNING, SUSPENDED], "Suspended", "Suspended", said_by("Suspended")),
    "child-conflict": ([CONFLICT], "Pending", "Degraded", said_by("ChildrenReady")),
    "child-forbidden": ([FORBIDDEN], "Pending", "Degraded", said_by("ChildrenReady")),
    "child-api-error": ([PENDING, RUNNING, API_ERROR], "Training", "Progressing", said_by("ChildrenReady")),
    "unschedulable": ([PENDING, CREATED, UNSCHEDULABLE], "Pending", "Degraded", said_by("Training")),
    "unschedulable-cleared": (
        [PENDING, UNSCHEDULABLE, CREATED],
        "Pending",
        "Progressing",
        said_by("Training"),
    ),
    "worker-unschedulable": (
        [PENDING, RUNNING, WORKER_UNSCHEDULABLE],
        "Training",
        "Degraded",
        said_by("Training"),
    ),
    "pods-not-created": ([PENDING, CREATED, NOT_CREATED], "Pending", "Degraded", said_by("Training")),
    "image-pull-failed": ([PENDING, CREATED, IMAGE_PULL], "Pending", "Degraded", said_by("Training")),
    "mount-failed": ([PENDING, CREATED, MOUNT_FAILED], "Pending", "Degraded", said_by("Training")),
    "worker-mount-failed": (
        [PENDING, RUNNING, WORKER_MOUNT_FAILED],
        "Training",
        "Degraded",
        said_by("Training"),
    ),
    "training-failed-disk-full": ([PENDING, RUNNING, DISK_FULL], "Failed", "Degraded", said_by("Ready")),
    "training-failed-oom-killed": ([PENDING, RUNNING, OOM_KILLED], "Failed", "Degraded", said_by("Ready")),
    "succeeded-at-budget": (
        [PENDING, RUNNING, BUDGET_REPORT, BUDGET_REGISTERING, BUDGET_REGISTERED],
        "Succeeded",
        "Healthy",
        registered_and("BudgetReached"),
    ),
    "succeeded-at-budget-not-registered": (
        [PENDING, RUNNING, BUDGET_REPORT, BUDGET_NOT_REGISTERED],
        "Succeeded",
        "Healthy",
        both("Ready", "BudgetReached"),
    ),
}


def test_health_of_statuses_the_operator_writes(
    kube: Kube, namespace: str, new_job: Callable[[str], str]
) -> None:
    for scenario, (steps, phase, expected, message) in SCENARIOS.items():
        obj = drive(kube, namespace, new_job(scenario), *steps)
        assert obj["status"]["phase"] == phase, (scenario, obj["status"])
        text = message(obj) if callable(message) else message
        assert health(obj) == {"status": expected, "message": text}, (scenario, obj["status"])
    assert {phase for _, phase, _, _ in SCENARIOS.values()} == {p.value for p in Phase}


def test_the_alias_messages_say_what_happened(
    kube: Kube, namespace: str, new_job: Callable[[str], str]
) -> None:
    """The operator's words for the alias, spelled out once (the scenarios above take them as stored)."""
    obj = drive(kube, namespace, new_job("alias"), PENDING, RUNNING, REGISTERING, REGISTERED, ALIAS_FAILED)
    assert health(obj) == {
        "status": "Degraded",
        "message": f"{REGISTERED_MESSAGE}; moving the alias to 'challenger' failed: "
        "BackoffLimitExceeded: 401 Unauthorized",
    }


def test_a_training_failure_shows_its_reason_and_message(
    kube: Kube, namespace: str, new_job: Callable[[str], str]
) -> None:
    """The operator's words for a failure and a budget, spelled out once (the scenarios above take
    them as stored): the reason leads the Degraded message, the budget follows the model."""
    obj = drive(kube, namespace, new_job("disk-full"), PENDING, RUNNING, DISK_FULL)
    hs = health(obj)
    assert hs["status"] == "Degraded"
    assert hs["message"].startswith(
        "DiskFull at step 120: pod job-train-master-0: No space left on device on the checkpoint volume. "
        "What to do: the previous checkpoint stays usable"
    )
    obj = drive(kube, namespace, new_job("oom-killed"), PENDING, RUNNING, OOM_KILLED)
    assert health(obj)["message"].startswith(
        "HostOutOfMemory: the kernel killed the trainer in pod job-train-master-0 for host memory (exit code 137; "
        "memory limit 64Gi)"
    )
    obj = drive(
        kube,
        namespace,
        new_job("budget"),
        PENDING,
        RUNNING,
        BUDGET_REPORT,
        BUDGET_REGISTERING,
        BUDGET_REGISTERED,
    )
    assert health(obj) == {
        "status": "Healthy",
        "message": f"{REGISTERED_MESSAGE}; training stopped at spec.budget maxDuration 2h: step 300 of 500 "
        "planned; the final model is that step's",
    }


def test_new_job_without_status_is_progressing(
    kube: Kube, namespace: str, new_job: Callable[[str], str]
) -> None:
    name = new_job("fresh")
    obj = kube.get(api.API_VERSION, api.KIND, namespace, name)
    assert obj is not None and "status" not in obj
    assert health(obj) == {
        "status": "Progressing",
        "message": "Waiting for the kubetune operator to pick up the FineTuneJob",
    }


def test_spec_change_not_yet_acted_on_is_progressing(
    kube: Kube, namespace: str, new_job: Callable[[str], str]
) -> None:
    name = new_job("stale")
    drive(kube, namespace, name, PENDING, RUNNING, {"progress": PROGRESS})
    kube.patch(api.API_VERSION, api.KIND, namespace, name, {"spec": {"suspend": True}})
    obj = kube.get(api.API_VERSION, api.KIND, namespace, name)
    assert obj is not None and obj["metadata"]["generation"] == 2 and obj["status"]["observedGeneration"] == 1
    assert health(obj) == {
        "status": "Progressing",
        "message": "Waiting for the operator to act on generation 2",
    }


def test_succeeded_job_stays_healthy_when_its_alias_changes(
    kube: Kube, namespace: str, new_job: Callable[[str], str]
) -> None:
    name = new_job("realias")
    drive(kube, namespace, name, PENDING, RUNNING, REGISTERING, REGISTERED)
    kube.patch(
        api.API_VERSION, api.KIND, namespace, name, {"spec": {"registration": {"alias": "challenger"}}}
    )
    obj = kube.get(api.API_VERSION, api.KIND, namespace, name)
    assert obj is not None and obj["metadata"]["generation"] == 2
    assert health(obj) == {"status": "Healthy", "message": REGISTERED_MESSAGE}


# --- install instructions -------------------------------------------------------------------------------


def test_argocd_cm_patch_carries_the_script_and_applies(control_plane: ControlPlane, namespace: str) -> None:
    patch_file = ARGOCD / "argocd-cm-health.yaml"
    control_plane.kubectl(
        "create", "configmap", "argocd-cm", "-n", namespace, "--from-literal=url=https://argocd.example.com"
    )
    control_plane.kubectl(
        "patch", "configmap", "argocd-cm", "-n", namespace, "--type", "merge", "--patch-file", str(patch_file)
    )
    data = json.loads(
        control_plane.kubectl("get", "configmap", "argocd-cm", "-n", namespace, "-o", "json").stdout
    )["data"]
    assert data[HEALTH_KEY] == SCRIPT
    assert data["url"] == "https://argocd.example.com"
    # the default library set is enough: no useOpenLibs key is shipped
    assert not [key for key in data if key.startswith("resource.customizations.useOpenLibs")]


def _applications() -> dict[str, dict[str, Any]]:
    return {
        p.name: yaml.safe_load(p.read_text())
        for p in sorted(ARGOCD.glob("*.yaml"))
        if "argocd-cm" not in p.name
    }


def test_argocd_applications_have_the_sync_options_crds_need() -> None:
    apps = _applications()
    assert set(apps) == {"kubetune.yaml", "finetunejobs.yaml"}
    for name, app in apps.items():
        assert app["apiVersion"] == "argoproj.io/v1alpha1" and app["kind"] == "Application", name
        options = app["spec"]["syncPolicy"]["syncOptions"]
        assert "ServerSideApply=true" in options, name
    assert (
        "SkipDryRunOnMissingResource=true" in apps["finetunejobs.yaml"]["spec"]["syncPolicy"]["syncOptions"]
    )
    assert apps["finetunejobs.yaml"]["spec"]["syncPolicy"]["automated"]["prune"] is False
    source = apps["kubetune.yaml"]["spec"]["source"]
    assert (REPO / source["path"] / "Chart.yaml").exists()


def test_argocd_chart_values_pass_the_charts_schema(tmp_path: Path) -> None:
    from tests.unit.test_chart import CHART, helm

    values = copy.deepcopy(_applications()["kubetune.yaml"]["spec"]["source"]["helm"]["valuesObject"])
    (tmp_path / "values.yaml").write_text(yaml.safe_dump(values))
    result = helm("template", "kubetune", str(CHART), "-f", str(tmp_path / "values.yaml"), check=False)
    assert result.returncode == 0, result.stderr
