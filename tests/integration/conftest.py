"""Fixtures for operator tests against the real API server: the operator itself, and the test
playing the controllers that do not run here (the Kubeflow Training Operator, the Job controller)."""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.support.controlplane import REPO, ControlPlane
from tests.support.operator import OperatorProcess

API_VERSION = "kubetune.io/v1alpha1"
# What the registration of examples/qwen3-4b-full.yaml reports: the spec's alias is on the version.
QWEN3_REGISTRATION_RESULT = {
    "name": "qwen3_4b_assistant",
    "version": "1",
    "uri": "models:/qwen3_4b_assistant/1",
    "run_id": "r1",
    "alias": "champion",
}
EXAMPLES = REPO / "examples"
POLL = 0.1


def wait_for(check: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """Poll ``check`` until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(POLL)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")


# A refused request as kopf and the kubernetes client log it: "Forbidden", or the status code 403 on
# its own (not digits inside a timestamp's microseconds or an object's uid).
# 403 as a status of its own ("(403)", "status=403", "403 Forbidden"), not digits of a timestamp
# ("12:37:18.787403", kopf's "17:06:04,403") or of a uid
# ("code': 403" is a refusal; "'resourceVersion': '403'", a quoted string of digits, is not)
_DENIED = re.compile(r"forbidden|(?<![\w.:'\"-])(?<!\d,)403(?![\w.'\"-]|,\d)", re.IGNORECASE)


def denials(log: str) -> list[str]:
    """The lines of an operator log that report a request the API server refused."""
    return [line for line in log.splitlines() if _DENIED.search(line)]


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@pytest.fixture(scope="session")
def kube(api_client: Any) -> Any:
    from kubetune_operator.kube import Kube

    return Kube(api_client)


@pytest.fixture
def operator_env(control_plane: ControlPlane, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    env = {
        "KUBECONFIG": str(control_plane.kubeconfig),
        "KUBETUNE_TRAINER_IMAGE": "registry.example.com/kubetune/trainer:test",
        "KUBETUNE_MLFLOW_TRACKING_URI": "http://mlflow.mlflow.svc:5000",
        "KUBETUNE_RETRY_SECONDS": "1",
        # These tests play the Training Operator and the Job controller by writing the children's
        # status; the preparation Job's pod never runs here. The preparation step is tested through
        # the real controllers and the pod runner in tests/cluster/test_preparation.py.
        "KUBETUNE_PREPARATION": "false",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


@contextlib.contextmanager
def kopf_runner(namespace: str) -> Iterator[Any]:
    from kopf.testing import KopfRunner

    args = ["run", "--standalone", "--namespace", namespace, "-m", "kubetune_operator.handlers"]
    with KopfRunner(args, timeout=60) as runner:
        yield runner
    # A crash inside the operator thread must fail the test, not hide in a log.
    assert runner.exception is None, runner.output
    assert runner.exit_code == 0, runner.output


@pytest.fixture
def operator(operator_env: dict[str, str], namespace: str) -> Iterator[Any]:
    """The operator (kopf in a thread of this process) watching the test's namespace."""
    with kopf_runner(namespace) as runner:
        yield runner


@pytest.fixture
def operator_process(
    operator_env: dict[str, str], namespace: str, tmp_path: Path
) -> Iterator[OperatorProcess]:
    proc = OperatorProcess(namespace, operator_env, tmp_path / "operator.log")
    try:
        yield proc
    finally:
        proc.kill()


# --- the test's own objects ----------------------------------------------------------------------------


def load_example(name: str, namespace: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((EXAMPLES / name).read_text())
    doc["metadata"]["namespace"] = namespace
    return doc


def get_job(kube: Any, namespace: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = kube.get(API_VERSION, "FineTuneJob", namespace, name)
    return obj


def phase_of(kube: Any, namespace: str, name: str) -> str | None:
    obj = kube.get(API_VERSION, "FineTuneJob", namespace, name) or {}
    return (obj.get("status") or {}).get("phase")


def wait_phase(kube: Any, namespace: str, name: str, phase: str, timeout: float = 30.0) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        obj = get_job(kube, namespace, name)
        return obj if (obj.get("status") or {}).get("phase") == phase else None

    try:
        result: dict[str, Any] = wait_for(check, timeout, f"phase {phase}")
    except AssertionError:
        raise AssertionError(f"phase {phase} not reached; object: {get_job(kube, namespace, name)}") from None
    return result


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return dict(c)
    raise AssertionError(f"no condition {type_} in {obj.get('status')}")


def events_for(kube: Any, namespace: str, name: str) -> list[dict[str, Any]]:
    out = kube.request("GET", f"/api/v1/namespaces/{namespace}/events")
    return [e for e in out.get("items") or [] if e["involvedObject"].get("name") == name]


# --- playing the controllers that do not run here -----------------------------------------------------


def set_pytorchjob_condition(kube: Any, namespace: str, name: str, type_: str, message: str = "") -> None:
    """Play the Training Operator: make ``type_`` the PyTorchJob's latest True condition."""
    obj = kube.get("kubeflow.org/v1", "PyTorchJob", namespace, name)
    conditions = [
        {**c, "status": "False"} if c["type"] in ("Running", "Restarting", "Suspended") else c
        for c in (obj.get("status") or {}).get("conditions") or []
        if c["type"] != type_
    ]
    conditions.append(
        {
            "type": type_,
            "status": "True",
            "reason": f"PyTorchJob{type_}",
            "message": message or f"PyTorchJob {name} is {type_.lower()}.",
            "lastUpdateTime": now(),
            "lastTransitionTime": now(),
        }
    )
    status: dict[str, Any] = {"conditions": conditions, "replicaStatuses": {"Master": {}}}
    if type_ in ("Succeeded", "Failed"):
        status["completionTime"] = now()
    kube.patch("kubeflow.org/v1", "PyTorchJob", namespace, name, {"status": status}, subresource="status")


def finish_registration_job(
    kube: Any, namespace: str, job_name: str, *, exit_code: int = 0, message: str = ""
) -> dict[str, Any]:
    """Play the Job controller: one pod of the Job that terminated with ``message``, then the
    Job's final conditions."""
    job = kube.get("batch/v1", "Job", namespace, job_name)
    template = job["spec"]["template"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{job_name}-{job['metadata']['uid'][:5]}",  # one pod per Job, also for a Job created anew
            "namespace": namespace,
            "labels": {**template["metadata"]["labels"], "batch.kubernetes.io/job-name": job_name},
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": job_name,
                    "uid": job["metadata"]["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": template["spec"],
    }
    kube.create(pod)
    container = template["spec"]["containers"][0]
    kube.patch(
        "v1",
        "Pod",
        namespace,
        pod["metadata"]["name"],
        {
            "status": {
                "phase": "Succeeded" if exit_code == 0 else "Failed",
                "containerStatuses": [
                    {
                        "name": container["name"],
                        "image": container["image"],
                        "imageID": "",
                        "ready": False,
                        "restartCount": 0,
                        "state": {
                            "terminated": {
                                "exitCode": exit_code,
                                "reason": "Completed" if exit_code == 0 else "Error",
                                "message": message,
                                "startedAt": now(),
                                "finishedAt": now(),
                            }
                        },
                    }
                ],
            }
        },
        subresource="status",
    )
    t = now()
    if exit_code == 0:
        conditions = [
            {
                "type": "SuccessCriteriaMet",
                "status": "True",
                "reason": "CompletionsReached",
                "message": "Reached expected number of succeeded pods",
                "lastProbeTime": t,
                "lastTransitionTime": t,
            },
            {
                "type": "Complete",
                "status": "True",
                "reason": "CompletionsReached",
                "message": "Reached expected number of succeeded pods",
                "lastProbeTime": t,
                "lastTransitionTime": t,
            },
        ]
        status = {"startTime": t, "completionTime": t, "succeeded": 1, "conditions": conditions}
    else:
        conditions = [
            {
                "type": "FailureTarget",
                "status": "True",
                "reason": "BackoffLimitExceeded",
                "message": "Job has reached the specified backoff limit",
                "lastProbeTime": t,
                "lastTransitionTime": t,
            },
            {
                "type": "Failed",
                "status": "True",
                "reason": "BackoffLimitExceeded",
                "message": "Job has reached the specified backoff limit",
                "lastProbeTime": t,
                "lastTransitionTime": t,
            },
        ]
        status = {"startTime": t, "failed": 1, "conditions": conditions}
    result: dict[str, Any] = kube.patch(
        "batch/v1", "Job", namespace, job_name, {"status": status}, subresource="status"
    )
    return result


def kubeconfig_for_service_account(control_plane: ControlPlane, namespace: str, sa: str, path: Path) -> Path:
    """A kubeconfig at ``path`` that acts as ServiceAccount ``sa`` (a token valid for an hour)."""
    token = control_plane.kubectl("create", "token", sa, "-n", namespace, "--duration=1h").stdout.strip()
    admin = yaml.safe_load(control_plane.kubeconfig.read_text())
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": admin["clusters"],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [{"name": sa, "context": {"cluster": admin["clusters"][0]["name"], "user": sa}}],
        "current-context": sa,
    }
    path.write_text(yaml.safe_dump(config))
    return path


def bind_operator_role(control_plane: ControlPlane, namespace: str, role_name: str) -> None:
    """The ServiceAccount ``kubetune-operator`` in ``namespace``, holding exactly the operator's rules
    (:func:`kubetune_operator.rbac.cluster_role`, what the chart grants) in a ClusterRole
    ``role_name``, bound cluster-wide (the chart's default). The caller deletes the ClusterRole and
    its binding (both named ``role_name``)."""
    from kubetune_operator import rbac

    control_plane.kubectl("create", "serviceaccount", "kubetune-operator", "-n", namespace)
    control_plane.kubectl("apply", "-f", "-", input=json.dumps(rbac.cluster_role(role_name)))
    control_plane.kubectl(
        "create",
        "clusterrolebinding",
        role_name,
        f"--clusterrole={role_name}",
        f"--serviceaccount={namespace}:kubetune-operator",
    )
