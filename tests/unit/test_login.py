"""kopf's login in a pod: the ServiceAccount's credentials at the address the kubelet puts in the
environment (the operator's own client's), not kopf's ``kubernetes.default.svc``, which needs DNS."""

from __future__ import annotations

import kopf
import pytest

from kubetune_operator import handlers


def service_account() -> kopf.ConnectionInfo:
    """What ``kopf.login_with_service_account`` returns in a pod (its fixed server name)."""
    return kopf.ConnectionInfo(
        server="https://kubernetes.default.svc",
        ca_path="/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
        token="the-token",
        default_namespace="kubetune-system",
    )


@pytest.mark.parametrize(
    ("host", "port", "server"),
    [
        ("10.96.0.1", "443", "https://10.96.0.1:443"),
        ("127.0.0.1", "6443", "https://127.0.0.1:6443"),
        ("fd00:10:96::1", None, "https://[fd00:10:96::1]:443"),
    ],
)
def test_the_api_server_is_the_one_the_environment_names(
    monkeypatch: pytest.MonkeyPatch, host: str, port: str | None, server: str
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host)
    if port is None:
        monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    else:
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", port)
    info = handlers.in_cluster(service_account())
    assert info is not None
    assert info.server == server
    # everything else is the ServiceAccount's, as kopf read it
    assert (info.token, info.ca_path, info.default_namespace) == (
        "the-token",
        "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
        "kubetune-system",
    )


def test_no_service_account_token_is_no_login(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    assert handlers.in_cluster(None) is None
