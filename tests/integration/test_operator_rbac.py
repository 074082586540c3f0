"""The operator does a whole fine-tune as a ServiceAccount holding only ``kubetune_operator.rbac``'s
rules: the list the Helm chart grants is complete, and nothing beyond it is used."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.integration.conftest import (
    bind_operator_role,
    denials,
    events_for,
    finish_registration_job,
    kopf_runner,
    kubeconfig_for_service_account,
    load_example,
    set_pytorchjob_condition,
    wait_for,
    wait_phase,
)
from tests.support.controlplane import ControlPlane

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


def test_whole_flow_with_least_privilege(
    kube: Any,
    control_plane: ControlPlane,
    namespace: str,
    operator_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    role_name = f"kubetune-operator-{namespace}"
    bind_operator_role(control_plane, namespace, role_name)
    kubeconfig = kubeconfig_for_service_account(
        control_plane, namespace, "kubetune-operator", tmp_path / "kc"
    )
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))

    doc = load_example("qwen2-0.5b-lora-8gpu.yaml", namespace)
    name = doc["metadata"]["name"]
    ptj = f"{name}-train"
    try:
        with kopf_runner(namespace) as runner:
            kube.create(doc)
            wait_for(lambda: kube.get("kubeflow.org/v1", "PyTorchJob", namespace, ptj), what="the PyTorchJob")
            set_pytorchjob_condition(kube, namespace, ptj, "Running")
            wait_phase(kube, namespace, name, "Training")
            kube.patch("kubetune.io/v1alpha1", "FineTuneJob", namespace, name, {"spec": {"suspend": True}})
            wait_phase(kube, namespace, name, "Suspended")
            kube.patch("kubetune.io/v1alpha1", "FineTuneJob", namespace, name, {"spec": {"suspend": False}})
            set_pytorchjob_condition(kube, namespace, ptj, "Succeeded")
            wait_for(
                lambda: kube.get("batch/v1", "Job", namespace, f"{name}-register"), what="registration Job"
            )
            result = {
                "name": "qwen2_liger_lora_assistant",
                "version": "7",
                "uri": "models:/x/7",
                "run_id": "r",
                "alias": "champion",
            }
            finish_registration_job(kube, namespace, f"{name}-register", message=json.dumps(result))
            obj = wait_phase(kube, namespace, name, "Succeeded")
            wait_for(lambda: [e for e in events_for(kube, namespace, name) if e["reason"] == "Succeeded"])
        assert obj["status"]["registeredModel"]["version"] == "7"
        assert not denials(runner.output), "\n".join(denials(runner.output))
    finally:
        control_plane.kubectl("delete", "clusterrolebinding", role_name, check=False)
        control_plane.kubectl("delete", "clusterrole", role_name, check=False)
