"""A child the real API server refuses: the FineTuneJob says so within one pass, with the child's
kind and name and the API server's own message, in its conditions and in an Event.

Every refusal comes from the API server's own machinery, never from a field the FineTuneJob CRD
happens to admit today (its rules grow): a ValidatingAdmissionPolicy (422 Invalid), a
ResourceQuota (403 Forbidden, exceeded quota), a validating webhook that denies (400 BadRequest,
the API server's code for a denial without one) or throttles (429), served by this test over TLS.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.integration.conftest import (
    API_VERSION,
    condition,
    events_for,
    get_job,
    load_example,
    wait_for,
    wait_phase,
)
from tests.support.controlplane import ControlPlane, free_port

from kubetune_operator.kube import ApiError

pytestmark = [pytest.mark.integration]

# "within one pass": the operator's first pass after the create, with room for a slow machine
ONE_PASS = 5.0
POLICY_MESSAGE = "PyTorchJobs in this namespace must carry a kubetune.io/team label"


def _start(kube: Any, namespace: str) -> str:
    doc = load_example("qwen3-4b-full.yaml", namespace)
    kube.create(doc)
    return str(doc["metadata"]["name"])


def _probe_pytorchjob(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "probe", "namespace": namespace},
        "spec": {"pytorchReplicaSpecs": {}},
    }


def _refusal(kube: Any, manifest: dict[str, Any]) -> ApiError | None:
    """The API server's answer to creating ``manifest`` (dry run): the error, or None when accepted."""
    try:
        kube.create(manifest, dry_run=True)
    except ApiError as e:
        return e
    return None


def _warnings(kube: Any, namespace: str, name: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in events_for(kube, namespace, name) if e["reason"] == reason and e["type"] == "Warning"]


def _showing(kube: Any, namespace: str, name: str, reason: str) -> dict[str, Any] | None:
    """The FineTuneJob when its ChildrenReady condition has ``reason``, else None."""
    obj = get_job(kube, namespace, name)
    conditions = [
        c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == "ChildrenReady"
    ]
    return obj if conditions and conditions[0]["reason"] == reason else None


def _apply(control_plane: ControlPlane, *docs: dict[str, Any]) -> None:
    control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))


def _delete(control_plane: ControlPlane, *refs: str) -> None:
    control_plane.kubectl("delete", "--ignore-not-found", "--wait=true", *refs)


# --- 422: a ValidatingAdmissionPolicy refuses the PyTorchJob ------------------------------------------


@pytest.fixture
def team_policy(control_plane: ControlPlane, kube: Any, namespace: str) -> Iterator[str]:
    """A policy, bound to the test's namespace, refusing PyTorchJobs without a team label (422)."""
    name = f"require-team-{namespace}"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": ["kubeflow.org"],
                        "apiVersions": ["*"],
                        "operations": ["CREATE"],
                        "resources": ["pytorchjobs"],
                    }
                ]
            },
            "validations": [
                {
                    "expression": "has(object.metadata.labels) && 'kubetune.io/team' in object.metadata.labels",
                    "message": POLICY_MESSAGE,
                }
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
            },
        },
    }
    _apply(control_plane, policy, binding)
    probe = _probe_pytorchjob(namespace)
    wait_for(
        lambda: (e := _refusal(kube, probe)) is not None and POLICY_MESSAGE in e.message,
        what="the admission policy in force",
    )
    yield name
    _delete(control_plane, f"validatingadmissionpolicybinding/{name}", f"validatingadmissionpolicy/{name}")


def test_a_pytorchjob_refused_as_invalid_fails_the_job_and_a_new_generation_retries(
    kube: Any, namespace: str, operator: Any, control_plane: ControlPlane, team_policy: str
) -> None:
    name = _start(kube, namespace)
    ptj = f"{name}-train"
    obj = wait_phase(kube, namespace, name, "Failed", timeout=ONE_PASS)
    ready, children = condition(obj, "Ready"), condition(obj, "ChildrenReady")
    for c in (ready, children):
        assert (c["status"], c["reason"]) == ("False", "ChildRejected")
        assert f"creating PyTorchJob {ptj}: 422 Invalid" in c["message"]
        assert POLICY_MESSAGE in c["message"]  # the API server's own words
        assert f"ValidatingAdmissionPolicy '{team_policy}'" in c["message"]
    assert obj["status"]["completionTime"]
    events = wait_for(lambda: _warnings(kube, namespace, name, "ChildRejected"), ONE_PASS, "the event")
    assert POLICY_MESSAGE in events[0]["message"] and "PyTorchJob" in events[0]["message"]
    # what came before the refused child exists; nothing is retried for the same spec
    assert kube.get("v1", "ConfigMap", namespace, f"{name}-config") is not None
    assert kube.get("v1", "PersistentVolumeClaim", namespace, f"{name}-ckpt") is not None
    time.sleep(3)  # three re-tries' worth of the test operator's 1 s retry interval
    assert kube.get("kubeflow.org/v1", "PyTorchJob", namespace, ptj) is None
    assert len(_warnings(kube, namespace, name, "ChildRejected")) == 1
    assert get_job(kube, namespace, name)["status"]["phase"] == "Failed"

    # The policy is lifted and the spec changes: the new generation is tried again and goes on.
    _delete(control_plane, f"validatingadmissionpolicybinding/{team_policy}")
    wait_for(lambda: _refusal(kube, _probe_pytorchjob(namespace)) is None, what="the policy lifted")
    kube.patch(API_VERSION, "FineTuneJob", namespace, name, {"spec": {"suspend": True}})
    obj = wait_phase(kube, namespace, name, "Suspended", timeout=ONE_PASS)
    assert "completionTime" not in obj["status"]
    assert condition(obj, "ChildrenReady")["reason"] == "ChildrenCreated"
    assert condition(obj, "Ready")["observedGeneration"] == 2
    created = kube.get("kubeflow.org/v1", "PyTorchJob", namespace, ptj)
    assert created["spec"]["runPolicy"]["suspend"] is True
    wait_for(  # kopf posts events from a queue, after the status write
        lambda: [e for e in events_for(kube, namespace, name) if e["reason"] == "ChildrenRetried"],
        what="a ChildrenRetried event",
    )


# --- 403: a ResourceQuota forbids the PVC -------------------------------------------------------------


def test_a_quota_that_forbids_the_volume_shows_at_once_and_the_job_goes_on_when_lifted(
    kube: Any, namespace: str, operator: Any, control_plane: ControlPlane
) -> None:
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "no-volumes", "namespace": namespace},
        "spec": {"hard": {"persistentvolumeclaims": "0"}},
    }
    kube.request("POST", f"/api/v1/namespaces/{namespace}/resourcequotas", quota)
    # No quota controller runs here: the test reports the usage it would (none used, none allowed).
    usage = {"hard": {"persistentvolumeclaims": "0"}, "used": {"persistentvolumeclaims": "0"}}
    kube.request(
        "PATCH",
        f"/api/v1/namespaces/{namespace}/resourcequotas/no-volumes/status",
        {"status": usage},
        content_type="application/merge-patch+json",
    )
    name = _start(kube, namespace)
    pvc = f"{name}-ckpt"
    obj = wait_for(lambda: _showing(kube, namespace, name, "ChildForbidden"), ONE_PASS, "ChildForbidden")
    assert obj["status"]["phase"] == "Pending"  # not failed: the quota can change
    for c in (condition(obj, "ChildrenReady"), condition(obj, "Ready")):
        assert (c["status"], c["reason"]) == ("False", "ChildForbidden")
        assert f"creating PersistentVolumeClaim {pvc}: 403 Forbidden" in c["message"]
        assert "exceeded quota: no-volumes" in c["message"]
    events = wait_for(lambda: _warnings(kube, namespace, name, "ChildForbidden"), ONE_PASS, "the event")
    assert "exceeded quota" in events[0]["message"] and pvc in events[0]["message"]
    assert kube.get("kubeflow.org/v1", "PyTorchJob", namespace, f"{name}-train") is None

    # Lifted: the next try (backoff) creates the volume and the rest, without any spec change.
    kube.request("DELETE", f"/api/v1/namespaces/{namespace}/resourcequotas/no-volumes")
    wait_for(
        lambda: kube.get("kubeflow.org/v1", "PyTorchJob", namespace, f"{name}-train"),
        timeout=30,
        what="the PyTorchJob once the quota is gone",
    )
    obj = wait_for(
        lambda: (
            (o := get_job(kube, namespace, name)) and condition(o, "ChildrenReady")["status"] == "True" and o
        ),
        what="ChildrenReady=True",
    )
    assert obj["status"]["phase"] == "Pending"
    assert obj["metadata"]["generation"] == 1  # no spec change was needed
    assert kube.get("v1", "PersistentVolumeClaim", namespace, pvc) is not None


# --- 400 and 429: a validating webhook that denies, then throttles --------------------------------------


class Webhook:
    """A validating admission webhook served over TLS on 127.0.0.1; ``answer`` says what it replies."""

    def __init__(self, workdir: Path) -> None:
        self.answer: dict[str, Any] = {"allowed": True}
        self.calls = 0
        workdir.mkdir(parents=True, exist_ok=True)
        self.cert, key = workdir / "webhook.crt", workdir / "webhook.key"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
             "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
             "-keyout", str(key), "-out", str(self.cert)],
            check=True,
            capture_output=True,
        )  # fmt: skip
        webhook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                webhook.calls += 1
                body = json.dumps(
                    {
                        "apiVersion": "admission.k8s.io/v1",
                        "kind": "AdmissionReview",
                        "response": {"uid": review["request"]["uid"], **webhook.answer},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.port = free_port()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(self.cert, key)
        self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@contextlib.contextmanager
def pytorchjob_webhook(control_plane: ControlPlane, namespace: str, tmp_path: Path) -> Iterator[Webhook]:
    import base64

    hook = Webhook(tmp_path / "webhook")
    name = f"pytorchjobs-{namespace}"
    config = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": "pytorchjobs.kubetune-test.example.com",
                "clientConfig": {
                    "url": f"https://127.0.0.1:{hook.port}/validate",
                    "caBundle": base64.b64encode(hook.cert.read_bytes()).decode(),
                },
                "rules": [
                    {
                        "apiGroups": ["kubeflow.org"],
                        "apiVersions": ["*"],
                        "operations": ["CREATE"],
                        "resources": ["pytorchjobs"],
                    }
                ],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 5,
            }
        ],
    }
    try:
        _apply(control_plane, config)
        yield hook
    finally:
        _delete(control_plane, f"validatingwebhookconfiguration/{name}")
        hook.server.shutdown()


def _in_force(kube: Any, namespace: str, hook: Webhook) -> None:
    before = hook.calls
    wait_for(
        lambda: _refusal(kube, _probe_pytorchjob(namespace)) is not None and hook.calls > before,
        what="the webhook in force",
    )


def test_a_webhook_denial_without_a_code_is_a_bad_request_that_fails_the_job(
    kube: Any, namespace: str, operator: Any, control_plane: ControlPlane, tmp_path: Path
) -> None:
    denial = "image registry.example.com is not on this cluster's list of registries"
    with pytorchjob_webhook(control_plane, namespace, tmp_path) as hook:
        hook.answer = {"allowed": False, "status": {"message": denial}}
        _in_force(kube, namespace, hook)
        name = _start(kube, namespace)
        obj = wait_phase(kube, namespace, name, "Failed", timeout=ONE_PASS)
        ready = condition(obj, "Ready")
        assert ready["reason"] == "ChildRejected"
        assert f"creating PyTorchJob {name}-train: 400 Bad Request" in ready["message"]
        assert denial in ready["message"]
        assert condition(obj, "ChildrenReady")["reason"] == "ChildRejected"
        events = wait_for(lambda: _warnings(kube, namespace, name, "ChildRejected"), ONE_PASS, "the event")
        assert denial in events[0]["message"]


def test_a_throttling_webhook_is_retried_shown_after_a_few_tries_and_never_fails_the_job(
    kube: Any, namespace: str, operator: Any, control_plane: ControlPlane, tmp_path: Path
) -> None:
    with pytorchjob_webhook(control_plane, namespace, tmp_path) as hook:
        hook.answer = {"allowed": False, "status": {"code": 429, "message": "too many requests, slow down"}}
        _in_force(kube, namespace, hook)
        before = hook.calls
        name = _start(kube, namespace)
        wait_phase(kube, namespace, name, "Pending", timeout=ONE_PASS)  # a status from the first pass

        # retried with backoff (1, 2 s with the test operator's 1 s retry interval), shown on the 3rd try
        obj = wait_for(lambda: _showing(kube, namespace, name, "ChildApiError"), 15, "ChildApiError")
        assert hook.calls - before >= 3
        message = condition(obj, "ChildrenReady")["message"]
        assert f"creating PyTorchJob {name}-train: 429 Too Many Requests" in message
        assert "too many requests, slow down" in message
        assert obj["status"]["phase"] == "Pending"
        assert condition(obj, "Ready")["reason"] == "ChildApiError"
        # kopf posts events from a queue, after the status write the test saw
        wait_for(lambda: _warnings(kube, namespace, name, "ChildApiError"), ONE_PASS, "the event")

        # The webhook recovers: the next try goes through, and the job was never failed.
        hook.answer = {"allowed": True}
        created = wait_for(
            lambda: kube.get("kubeflow.org/v1", "PyTorchJob", namespace, f"{name}-train"),
            timeout=30,
            what="the PyTorchJob once the webhook allows it",
        )
        assert created["metadata"]["name"] == f"{name}-train"
        obj = wait_for(
            lambda: (
                (o := get_job(kube, namespace, name))
                and condition(o, "ChildrenReady")["status"] == "True"
                and o
            ),
            what="ChildrenReady=True",
        )
        assert obj["status"]["phase"] == "Pending"
        assert not [e for e in events_for(kube, namespace, name) if e["reason"] == "ChildRejected"]
