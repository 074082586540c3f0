"""A small dict-in, dict-out Kubernetes client on top of the official one's ApiClient.

The operator works with plain manifests (what the builders return), so it speaks to the API by
path: one code path for core, batch, RBAC and custom resources, no model classes in between.
"""

from __future__ import annotations

import json
import os
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from . import metrics

MERGE_PATCH = "application/merge-patch+json"


class ApiError(Exception):
    """The API server's refusal (``status`` is its HTTP status), or no answer at all (status 0)."""

    def __init__(self, status: int, reason: str, body: str) -> None:
        super().__init__(f"{status} {reason}: {body[:500]}")
        self.status = status
        self.reason = reason
        self.body = body

    @property
    def status_reason(self) -> str:
        """The ``Status`` object's reason (``Invalid``, ``Forbidden``, ...), else the HTTP reason."""
        return str(self._status_object().get("reason") or self.reason)

    @property
    def message(self) -> str:
        """The ``Status`` object's message (what the API server says was wrong), else the body."""
        return str(self._status_object().get("message") or self.body or self.reason)[:2000]

    def _status_object(self) -> dict[str, Any]:
        try:
            data = json.loads(self.body)
        except ValueError:
            return {}
        return data if isinstance(data, dict) and data.get("kind") == "Status" else {}

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409


def load_api_client(connections: int | None = None) -> client.ApiClient:
    """In a pod: the ServiceAccount token; elsewhere (tests, a laptop): $KUBECONFIG or ~/.kube/config.

    ``connections``: keep up to this many connections to the API server open, one for each thread
    that may make requests at once (the client's default is 5 per CPU of the node)."""
    cfg = client.Configuration()
    if connections is not None:
        cfg.connection_pool_maxsize = max(cfg.connection_pool_maxsize, connections)
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=cfg)
    else:
        # Read $KUBECONFIG now: the client's own default was fixed when it was imported.
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG"), client_configuration=cfg)
    return client.ApiClient(cfg)


def collection_path(api_version: str, plural: str, namespace: str) -> str:
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{base}/namespaces/{namespace}/{plural}"


# kind -> plural for the kinds the operator handles.
PLURALS = {
    "PersistentVolumeClaim": "persistentvolumeclaims",
    "ConfigMap": "configmaps",
    "ServiceAccount": "serviceaccounts",
    "Pod": "pods",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "Job": "jobs",
    "Event": "events",
    "PyTorchJob": "pytorchjobs",
    "TrainJob": "trainjobs",
    "TrainingRuntime": "trainingruntimes",
    "JobSet": "jobsets",
    "FineTuneJob": "finetunejobs",
    "Workload": "workloads",  # Kueue's (kueue.x-k8s.io): read only
}


class Kube:
    def __init__(self, api: client.ApiClient, timeout: float = 30.0) -> None:
        self.api = api
        self.timeout = timeout

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        query: list[tuple[str, str]] | None = None,
    ) -> dict[str, Any]:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        params = self.api.param_serialize(
            method=method,
            resource_path=path,
            query_params=query or [],
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            resp = self.api.call_api(*params, _request_timeout=self.timeout)
            data = resp.read()
        except ApiException as e:  # transport-level errors surface this way too
            raise _refused(method, ApiError(int(e.status or 0), str(e.reason), str(e.body or ""))) from e
        except (urllib3.exceptions.HTTPError, OSError) as e:  # no answer: refused, reset, timed out
            raise _refused(method, ApiError(0, "NoResponse", f"{type(e).__name__}: {e}")) from e
        text = data.decode() if isinstance(data, bytes) else str(data or "")
        if not 200 <= resp.status < 300:
            raise _refused(method, ApiError(resp.status, str(resp.reason), text))
        result: dict[str, Any] = json.loads(text) if text else {}
        return result

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.request("GET", f"{collection_path(api_version, PLURALS[kind], namespace)}/{name}")
        except ApiError as e:
            if e.not_found:
                return None
            raise

    def resources(self, api_version: str) -> dict[str, Any] | None:
        """The API server's discovery of one group and version (its ``APIResourceList``); None when
        it does not serve that group and version."""
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        try:
            return self.request("GET", base)
        except ApiError as e:
            if e.not_found:
                return None
            raise

    def list(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        label_selector: str = "",
        *,
        field_selector: str = "",
    ) -> list[dict[str, Any]]:
        query = [("labelSelector", label_selector)] if label_selector else []
        if field_selector:
            query.append(("fieldSelector", field_selector))
        out = self.request("GET", collection_path(api_version, PLURALS[kind], namespace), query=query)
        items: list[dict[str, Any]] = out.get("items") or []
        return items

    def create(self, manifest: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        meta = manifest["metadata"]
        path = collection_path(manifest["apiVersion"], PLURALS[manifest["kind"]], meta["namespace"])
        return self.request("POST", path, manifest, query=[("dryRun", "All")] if dry_run else None)

    def delete(self, api_version: str, kind: str, namespace: str, name: str, *, uid: str) -> bool:
        """Delete one object, only if it is still the one with ``uid`` (a precondition); its dependents
        go in the background. False when it was already gone (or is another object by now)."""
        body: dict[str, Any] = {
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "propagationPolicy": "Background",
            "preconditions": {"uid": uid},
        }
        try:
            self.request("DELETE", f"{collection_path(api_version, PLURALS[kind], namespace)}/{name}", body)
        except ApiError as e:
            if e.not_found or e.conflict:
                return False
            raise
        return True

    def patch(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        name: str,
        patch: dict[str, Any],
        *,
        subresource: str = "",
    ) -> dict[str, Any]:
        path = f"{collection_path(api_version, PLURALS[kind], namespace)}/{name}"
        if subresource:
            path += f"/{subresource}"
        return self.request("PATCH", path, patch, content_type=MERGE_PATCH)


def _refused(method: str, error: ApiError) -> ApiError:
    """Count a refused request (:mod:`.metrics`); reading something absent is an answer, not an error."""
    if not (method.upper() == "GET" and error.not_found):
        metrics.api_error(method, error.status)
    return error
