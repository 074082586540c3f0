"""The admission table (tests/support/admission_table.py) against the real API server and the real
kubectl, and through the Python check: every invalid FineTuneJob is refused by both, each naming the
same field; every edge value is admitted by both.

The manifests go in two ``kubectl create --dry-run=server`` calls (one for the invalid, one for the
valid), not one call each: kubectl reports each object's outcome on its own line, named by the
object, so each case is still asserted on its own. A case whose error does not name its object (a
decoding error) is sent again alone."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from tests.support.admission_table import INVALID, NULLS, VALID, Case, left_out, manifests, named
from tests.support.controlplane import ControlPlane

from kubetune_api.admission import all_rules
from kubetune_api.admission import problems as python_problems
from kubetune_api.spec import FineTuneJob

pytestmark = pytest.mark.integration

BAD = named(INVALID, "bad")
GOOD = named(VALID, "edge")
_ERROR = re.compile(r'FineTuneJob\.kubetune\.io "([^"]+)" is invalid: (.*)')
_CREATED = re.compile(r"finetunejob\.kubetune\.io/(\S+) created \(server dry run\)")


def _create(cp: ControlPlane, namespace: str, docs: list[dict[str, Any]]) -> Any:
    # JSON documents: YAML would let kubectl (YAML 1.2) read a string such as 1e3 as a number
    text = "\n---\n".join(json.dumps(d) for d in docs)
    return cp.kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-", input=text, check=False)


def _outcomes(cp: ControlPlane, namespace: str, cases: dict[str, Case]) -> dict[str, tuple[bool, str]]:
    """name -> (admitted, what the API server said), from one kubectl call (and one more per case
    whose error names no object)."""
    out = _create(cp, namespace, manifests(cases))
    seen: dict[str, tuple[bool, str]] = {}
    for line in out.stdout.splitlines():
        m = _CREATED.search(line)
        if m:
            seen[m.group(1)] = (True, line)
    for line in out.stderr.splitlines():
        m = _ERROR.search(line)
        if m:
            seen[m.group(1)] = (False, m.group(2))
    for name, case in cases.items():
        if name not in seen:
            alone = _create(cp, namespace, [case.manifest(name)])
            seen[name] = (alone.returncode == 0, alone.stdout + alone.stderr)
    return seen


@pytest.fixture(scope="module")
def admission(control_plane: ControlPlane) -> dict[str, dict[str, tuple[bool, str]]]:
    namespace = "admission-table"
    control_plane.kubectl("create", "namespace", namespace, check=False)
    return {
        "bad": _outcomes(control_plane, namespace, BAD),
        "good": _outcomes(control_plane, namespace, GOOD),
    }


def test_the_table_is_large_and_its_names_are_its_own() -> None:
    assert len(INVALID) >= 80 and len(VALID) >= 20
    assert len({c.id for c in INVALID + VALID}) == len(INVALID) + len(VALID)


@pytest.mark.parametrize("name", list(BAD), ids=[c.id for c in BAD.values()])
def test_refused_by_the_api_server_and_by_python_naming_the_field(
    admission: dict[str, dict[str, tuple[bool, str]]], name: str
) -> None:
    case = BAD[name]
    admitted, said = admission["bad"][name]
    assert not admitted, f"the API server admitted {case.id}: {said}"
    assert case.field in said, f"{case.id}: the API server did not name {case.field}: {said}"
    problems = python_problems(case.manifest(name))
    assert problems, f"{case.id}: the Python check admitted what the API server refused: {said}"
    assert any(case.field in p for p in problems), (case.id, problems)


@pytest.mark.parametrize("name", list(GOOD), ids=[c.id for c in GOOD.values()])
def test_edge_values_admitted_by_both(admission: dict[str, dict[str, tuple[bool, str]]], name: str) -> None:
    case = GOOD[name]
    admitted, said = admission["good"][name]
    assert admitted, f"the API server refused {case.id}: {said}"
    assert python_problems(case.manifest(name)) == [], case.id


def _stored(cp: ControlPlane, namespace: str, doc: dict[str, Any], *how: str) -> Any:
    """The spec the API server would store for ``doc`` (a dry run), or what it said refusing it."""
    out = cp.kubectl(
        *how, "--dry-run=server", "-n", namespace, "-f", "-", "-o", "json", input=json.dumps(doc), check=False
    )
    return json.loads(out.stdout)["spec"] if out.returncode == 0 else out.stdout + out.stderr


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


@pytest.fixture(scope="module")
def null_namespace(control_plane: ControlPlane) -> str:
    control_plane.kubectl("create", "namespace", "admission-nulls", check=False)
    return "admission-nulls"


@pytest.mark.parametrize("case", NULLS, ids=[c.id for c in NULLS])
def test_a_null_field_is_the_field_left_out_for_create_server_side_apply_and_python(
    control_plane: ControlPlane, null_namespace: str, case: Case
) -> None:
    """kubectl create used to drop a null that server-side apply refused ("must be of type
    object"): now both admit it, store what the manifest without that field stores (the null kept
    on a nullable field, which every CEL rule reads as absent), and so does the Python check."""
    doc = case.manifest("with-null")
    created = _stored(control_plane, null_namespace, doc, "create")
    applied = _stored(control_plane, null_namespace, doc, "apply", "--server-side", "--field-manager=test")
    assert isinstance(created, dict), f"kubectl create refused {case.id}: {created}"
    assert isinstance(applied, dict), f"server-side apply refused {case.id}: {applied}"
    without = _stored(control_plane, null_namespace, left_out(case).manifest("with-null"), "create")
    assert _without_nulls(created) == _without_nulls(applied) == without, case.id
    assert python_problems(doc) == [], case.id
    assert (
        FineTuneJob.model_validate({**doc, "spec": created}).spec
        == FineTuneJob.model_validate({**doc, "spec": without}).spec
    )


def test_nothing_was_stored(control_plane: ControlPlane, admission: dict[str, Any]) -> None:
    listed = json.loads(control_plane.kubectl("get", "ftj", "-n", "admission-table", "-o", "json").stdout)
    assert listed["items"] == []


def test_counts_of_crd_rules_and_python_twins(
    control_plane: ControlPlane, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CRD the API server serves (not the file): its CEL rules, each with its Python twin."""
    crd = json.loads(control_plane.kubectl("get", "crd", "finetunejobs.kubetune.io", "-o", "json").stdout)
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]

    def walk(node: dict[str, Any]) -> list[tuple[str, str]]:
        found = [(v["rule"], v["message"]) for v in node.get("x-kubernetes-validations", [])]
        for sub in node.get("properties", {}).values():
            found += walk(sub)
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                found += walk(node[key])
        return found

    served = walk(schema)
    twins = [(r.cel, r.message) for r in all_rules() for _ in r.places if callable(r.check)]
    with capsys.disabled():
        print(f"\nCRD served by the API server: {len(served)} CEL rules; Python twins: {len(twins)}")
    assert sorted(served) == sorted(twins)
