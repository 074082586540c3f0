"""Shared fixtures: the real control plane (session-wide) and API clients for it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.controlplane import REPO, ControlPlane, running_control_plane


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """etcd + kube-apiserver on 127.0.0.1 with our CRD and the PyTorchJob CRD installed."""
    if os.environ.get("KUBETUNE_SKIP_CONTROL_PLANE"):
        pytest.skip("KUBETUNE_SKIP_CONTROL_PLANE is set")
    with running_control_plane() as cp:
        yield cp


@pytest.fixture(scope="session")
def api_client(control_plane: ControlPlane):  # type: ignore[no-untyped-def]
    """A kubernetes ApiClient for the test API server, as admin (system:masters)."""
    from kubernetes import client, config

    cfg = client.Configuration()
    config.load_kube_config(config_file=str(control_plane.kubeconfig), client_configuration=cfg)
    with client.ApiClient(cfg) as api:
        yield api


@pytest.fixture
def namespace(control_plane: ControlPlane, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace per test."""
    import re
    import uuid

    base = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
    name = f"{base}-{uuid.uuid4().hex[:5]}"
    control_plane.kubectl("create", "namespace", name)
    yield name
    control_plane.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="session")
def real_pytorchjob_crd(control_plane: ControlPlane) -> None:
    if not control_plane.real_pytorchjob_crd:
        pytest.skip("../shared/crds/kubeflow.org_pytorchjobs.yaml is absent: the stand-in CRD is installed")
