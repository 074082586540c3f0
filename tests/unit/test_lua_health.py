"""The Argo CD health check for FineTuneJob (deploy/argocd/health/finetunejob.lua), run by a real Lua
interpreter (lupa; Lua 5.1 as in Argo CD's gopher-lua, and 5.4) against real status objects.

The statuses are what the operator would write: its own state machine (``state.advance``) produces
them from observations of the children, they are merge-patched through the status subresource of a
FineTuneJob on the real API server (the trainer's progress too), and read back from it.
"""

from __future__ import annotations

import copy
import importlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.support.controlplane import REPO, ControlPlane

from kubetune_api import spec as api
from kubetune_operator import state
from kubetune_operator.kube import Kube

pytestmark = pytest.mark.integration

ARGOCD = REPO / "deploy" / "argocd"
SCRIPT = (ARGOCD / "health" / "finetunejob.lua").read_text()
HEALTH_KEY = "resource.customizations.health.kubetune.io_FineTuneJob"
RUNTIMES = ["lupa.lua51", "lupa.lua54"]
NOW = "2026-11-30T10:00:00Z"
RESULT = {
    "name": "qwen3_4b_assistant",
    "version": "3",
    "uri": "models:/qwen3_4b_assistant/3",
    "run_id": "abc",
}
PROGRESS = {"step": 25, "totalSteps": 50, "percent": 50, "loss": 1.5, "etaSeconds": 600}


def health(obj: dict[str, Any], runtime: str) -> dict[str, str]:
    """Run the health script as Argo CD does: the object in the global ``obj``, ``hs`` returned."""
    lupa = importlib.import_module(runtime)
    lua = lupa.LuaRuntime(unpack_returned_tuples=False)
    lua.globals().obj = lua.table_from(json.loads(json.dumps(obj)), recursive=True)
    hs = lua.execute(SCRIPT)
    return {"status": hs["status"], "message": hs["message"]}


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


def drive(
    kube: Kube, namespace: str, name: str, *steps: state.Observation | dict[str, Any]
) -> dict[str, Any]:
    """Apply each step to the stored FineTuneJob (an observation: the operator's status write; a dict:
    the trainer's progress report), then read the object back."""
    for step in steps:
        obj = kube.get(api.API_VERSION, api.KIND, namespace, name)
        assert obj is not None
        if isinstance(step, dict):
            status = step
        else:
            previous = api.FineTuneJobStatus.model_validate(obj.get("status") or {})
            status = state.advance(previous, step).status
        kube.patch(api.API_VERSION, api.KIND, namespace, name, {"status": status}, subresource="status")
    stored = kube.get(api.API_VERSION, api.KIND, namespace, name)
    assert stored is not None
    return stored


SCENARIOS: dict[str, tuple[list[state.Observation | dict[str, Any]], str, str]] = {
    # name: (steps, expected health, a fragment of the expected message)
    "pending": ([PENDING], "Progressing", ""),
    "created": ([PENDING, CREATED], "Progressing", ""),
    "training": ([PENDING, RUNNING], "Progressing", ""),
    "training-with-progress": (
        [PENDING, RUNNING, {"progress": PROGRESS}],
        "Progressing",
        "step 25/50 (50%), loss 1.5000, ETA 10 min",
    ),
    "registering": ([PENDING, RUNNING, REGISTERING], "Progressing", ""),
    "succeeded": (
        [PENDING, RUNNING, REGISTERING, REGISTERED],
        "Healthy",
        "Registered model qwen3_4b_assistant version 3",
    ),
    "training-failed": ([PENDING, RUNNING, TRAINING_FAILED], "Degraded", "1 Master replica(s) failed"),
    "registration-failed": ([PENDING, RUNNING, REGISTRATION_FAILED], "Degraded", "401 Unauthorized"),
    "suspended": ([PENDING, RUNNING, SUSPENDED], "Suspended", ""),
    "child-conflict": ([CONFLICT], "Degraded", "PersistentVolumeClaim job-ckpt already exists"),
}
PHASES = {
    "pending": "Pending",
    "created": "Pending",
    "training": "Training",
    "training-with-progress": "Training",
    "registering": "Registering",
    "succeeded": "Succeeded",
    "training-failed": "Failed",
    "registration-failed": "Failed",
    "suspended": "Suspended",
    "child-conflict": "Pending",
}


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_health_of_every_phase(
    kube: Kube, namespace: str, new_job: Callable[[str], str], runtime: str
) -> None:
    results = {}
    for scenario, (steps, expected, fragment) in SCENARIOS.items():
        name = new_job(scenario)
        obj = drive(kube, namespace, name, *steps)
        assert obj["status"]["phase"] == PHASES[scenario], (scenario, obj["status"])
        hs = health(obj, runtime)
        results[scenario] = hs
        assert hs["status"] == expected, (scenario, hs, obj["status"])
        assert hs["message"], (scenario, hs)
        assert fragment in hs["message"], (scenario, hs)
        if expected in ("Degraded", "Suspended") or scenario in ("pending", "registering"):
            # The message is a condition's message, not a made-up one.
            messages = {c.get("message") for c in obj["status"]["conditions"]}
            assert hs["message"] in messages, (scenario, hs, messages)
    assert len(results) == len(SCENARIOS)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_new_job_without_status_is_progressing(
    kube: Kube, namespace: str, new_job: Callable[[str], str], runtime: str
) -> None:
    name = new_job("fresh")
    obj = kube.get(api.API_VERSION, api.KIND, namespace, name)
    assert obj is not None and "status" not in obj
    assert health(obj, runtime) == {
        "status": "Progressing",
        "message": "Waiting for the kubetune operator to pick up the FineTuneJob",
    }


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_spec_change_not_yet_acted_on_is_progressing(
    kube: Kube, namespace: str, new_job: Callable[[str], str], runtime: str
) -> None:
    name = new_job("stale")
    drive(kube, namespace, name, PENDING, RUNNING)
    kube.patch(api.API_VERSION, api.KIND, namespace, name, {"spec": {"suspend": True}})
    obj = kube.get(api.API_VERSION, api.KIND, namespace, name)
    assert obj is not None and obj["metadata"]["generation"] == 2 and obj["status"]["observedGeneration"] == 1
    assert health(obj, runtime) == {
        "status": "Progressing",
        "message": "Waiting for the operator to act on generation 2",
    }


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_succeeded_job_stays_healthy_when_its_alias_changes(
    kube: Kube, namespace: str, new_job: Callable[[str], str], runtime: str
) -> None:
    name = new_job("realias")
    drive(kube, namespace, name, PENDING, RUNNING, REGISTERING, REGISTERED)
    kube.patch(
        api.API_VERSION, api.KIND, namespace, name, {"spec": {"registration": {"alias": "challenger"}}}
    )
    obj = kube.get(api.API_VERSION, api.KIND, namespace, name)
    assert obj is not None and obj["metadata"]["generation"] == 2
    assert health(obj, runtime)["status"] == "Healthy"


def test_unknown_phase_is_unknown() -> None:
    obj = {"metadata": {"name": "x", "generation": 1}, "status": {"phase": "Exploded"}}
    assert health(obj, "lupa.lua51") == {"status": "Unknown", "message": "Unknown phase Exploded"}


# --- install instructions -------------------------------------------------------------------------------


def test_argocd_cm_patch_carries_the_script_and_applies(control_plane: ControlPlane, namespace: str) -> None:
    patch_file = ARGOCD / "argocd-cm-health.yaml"
    assert yaml.safe_load(patch_file.read_text())["data"][HEALTH_KEY] == SCRIPT
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
