"""What may change after creation, through the real API server: every field of the spec (walked from
the typed model, down into a field that holds a mutable path) is changed on a created FineTuneJob,
added where it was absent and removed where it was set; the paths of the one declared list
(``MUTABLE_SPEC_PATHS``) are stored, every other change is refused with the field's name."""

from __future__ import annotations

import json
from typing import Any

import pytest
from tests.support.controlplane import ControlPlane

from kubetune_api import admission
from kubetune_api.spec import MUTABLE_SPEC_PATHS, FineTuneJobSpec

pytestmark = pytest.mark.integration

SPARSE: dict[str, Any] = {
    "model": {"name": "Qwen/Qwen2-0.5B"},
    "dataset": {"name": "trl-lib/Capybara"},
    "training": {"maxSteps": 10},
}
# every field set (the optional ones too, so that each can be removed)
FULL: dict[str, Any] = {
    "model": {"name": "Qwen/Qwen2-0.5B"},
    "dataset": {"name": "trl-lib/Capybara", "evalFraction": 0.1},
    "method": "lora",
    "lora": {"r": 8},
    "objective": "dpo",
    "preference": {"beta": 0.1},
    "training": {"maxSteps": 10},
    "resources": {"gpusPerNode": 1},
    "storage": {"size": "10Gi"},
    "registration": {
        "enabled": True,
        "trackingUri": "http://mlflow-a:5000",
        "registryUri": "databricks-uc",
        "experiment": "team-a",
        "modelName": "model-a",
        "mergeLora": True,
        "alias": "first",
        "select": "final",
        "gate": {"maxEvalLoss": 2.0},
    },
    "preparation": {"maxTruncatedFraction": 0.5},
    "budget": {"maxDuration": "2h"},
    "resume": "latest",
    "secrets": {"huggingFaceToken": {"name": "hf-a", "key": "token"}},
    "env": [{"name": "NCCL_DEBUG", "value": "WARN"}],
    "image": "trainer:1",
    "suspend": False,
    "engine": "PyTorchJob",
}
# a valid value different from FULL's, for each path the walk finds
CHANGED: dict[str, Any] = {
    "model": {"name": "Qwen/Qwen3-4B"},
    "dataset": {"name": "trl-lib/Capybara", "evalFraction": 0.2},
    "method": "full",
    "lora": {"r": 16},
    "objective": "orpo",
    "preference": {"beta": 0.2},
    "training": {"maxSteps": 20},
    "resources": {"gpusPerNode": 2},
    "storage": {"size": "20Gi"},
    "registration.enabled": False,
    "registration.trackingUri": "http://mlflow-b:5000",
    "registration.registryUri": "http://registry-b:5000",
    "registration.experiment": "team-b",
    "registration.modelName": "model-b",
    "registration.mergeLora": False,
    "registration.alias": "second",
    "registration.select": "bestEval",
    "registration.gate": {"maxEvalLoss": 9.0},
    "preparation": {"maxTruncatedFraction": 0.9},
    "budget": {"maxDuration": "4h"},
    "resume": "none",
    "secrets": {"huggingFaceToken": {"name": "hf-b", "key": "token"}},
    "env": [{"name": "NCCL_DEBUG", "value": "INFO"}],
    "image": "trainer:2",
    "suspend": True,
    "engine": "TrainJob",
}


def _walk(model: type[Any] = FineTuneJobSpec, under: str = "") -> list[tuple[str, bool]]:
    """Each path of the spec at the granularity of the rules, and whether it has no default (it
    can be absent: added and removed)."""
    out = []
    for (wire, required, sub), info in zip(
        admission.fields_of(model), model.model_fields.values(), strict=True
    ):
        path = f"{under}{wire}"
        no_default = not required and info.default is None and info.default_factory is None
        if sub is not None and any(m.startswith(path + ".") for m in MUTABLE_SPEC_PATHS):
            out += _walk(sub, path + ".")
        else:
            out.append((path, no_default))
    return out


def _at(spec: dict[str, Any], path: str) -> Any:
    node: Any = spec
    for key in path.split("."):
        node = node.get(key) if isinstance(node, dict) else None
    return node


def _create(cp: ControlPlane, ns: str, name: str, spec: dict[str, Any]) -> None:
    doc = {
        "apiVersion": "kubetune.io/v1alpha1",
        "kind": "FineTuneJob",
        "metadata": {"name": name},
        "spec": spec,
    }
    cp.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(doc))


def _stored(cp: ControlPlane, ns: str, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = json.loads(cp.kubectl("get", "ftj", name, "-n", ns, "-o", "json").stdout)["spec"]
    return spec


def _json_patch(cp: ControlPlane, ns: str, name: str, op: str, path: str, value: Any = None) -> Any:
    patch: dict[str, Any] = {"op": op, "path": "/spec/" + path.replace(".", "/")}
    if op != "remove":
        patch["value"] = value
    return cp.kubectl("patch", "ftj", name, "-n", ns, "--type=json", "-p", json.dumps([patch]), check=False)


def _assert_outcome(cp: ControlPlane, ns: str, name: str, path: str, out: Any, wanted: Any) -> None:
    if path in MUTABLE_SPEC_PATHS:
        assert out.returncode == 0, (path, out.stderr)
        assert _at(_stored(cp, ns, name), path) == wanted, path
    else:
        assert out.returncode != 0, (path, "admitted")
        assert f"spec.{path} is immutable once created" in out.stderr, (path, out.stderr)


def test_the_walk_covers_every_field_and_every_mutable_path() -> None:
    walked = {p for p, _ in _walk()}
    assert walked == set(CHANGED)
    assert set(MUTABLE_SPEC_PATHS) <= walked
    assert all(_at(FULL, p) is not None and _at(FULL, p) != v for p, v in CHANGED.items())


def test_every_spec_field_changed_after_creation(control_plane: ControlPlane, namespace: str) -> None:
    _create(control_plane, namespace, "full", FULL)
    before = _stored(control_plane, namespace, "full")
    for path, _ in _walk():
        out = _json_patch(control_plane, namespace, "full", "replace", path, CHANGED[path])
        _assert_outcome(control_plane, namespace, "full", path, out, CHANGED[path])
    after = _stored(control_plane, namespace, "full")
    # only the mutable paths moved
    for path, _ in _walk():
        if path not in MUTABLE_SPEC_PATHS:
            assert _at(after, path) == _at(before, path), path


def test_every_optional_field_removed_after_creation(control_plane: ControlPlane, namespace: str) -> None:
    _create(control_plane, namespace, "full", FULL)
    for path, optional in _walk():
        if optional:
            out = _json_patch(control_plane, namespace, "full", "remove", path)
            _assert_outcome(control_plane, namespace, "full", path, out, None)


def test_every_optional_field_added_after_creation(control_plane: ControlPlane, namespace: str) -> None:
    _create(control_plane, namespace, "sparse", SPARSE)
    stored = _stored(control_plane, namespace, "sparse")
    for path, optional in _walk():
        if optional:
            assert _at(stored, path) is None, path
            out = _json_patch(control_plane, namespace, "sparse", "add", path, CHANGED[path])
            _assert_outcome(control_plane, namespace, "sparse", path, out, CHANGED[path])


def test_the_python_twin_agrees_on_every_field() -> None:
    """The same changes through :func:`kubetune_api.admission.check_update` (the twin of the
    transition rules): refused with the field named, unless the path is declared mutable."""
    old = FineTuneJobSpec.model_validate(FULL).wire()
    for path, _ in _walk():
        new = json.loads(json.dumps(old))
        node = new
        *parents, last = path.split(".")
        for key in parents:
            node = node[key]
        node[last] = CHANGED[path]
        problems = admission.check_update(old, new)
        if path in MUTABLE_SPEC_PATHS:
            assert problems == [], path
        else:
            assert [p.split(":")[0] for p in problems] == [f"spec.{path}"], (path, problems)
