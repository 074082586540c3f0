"""kubetune_api.rules: each rule declared once, enforced by the API server (CEL in the CRD) and by
its Python twin. Here without an API server: the CRD file's every rule and constraint has its twin,
the admission table gets the verdicts the real API server gives (tests/integration/
test_admission_table.py checks those), and every place that reads a manifest applies the rules."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError
from tests.support.admission_table import INVALID, VALID, Case

from kubetune_api import admission, cel, pod_env, rules, spec
from kubetune_api.trainer_config import TrainerConfig, load_manifest, resolve

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "crds" / "kubetune.io_finetunejobs.yaml"
BASE = yaml.safe_load((REPO / "examples" / "qwen3-4b-full.yaml").read_text())


def _crd_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD_FILE.read_text())
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def _walk(node: dict[str, Any], path: str) -> list[tuple[str, dict[str, Any]]]:
    """Every schema node with its wire path (``spec.env[]``, ``spec.resources.nodeSelector{}``)."""
    out = [(path, node)]
    for name, sub in node.get("properties", {}).items():
        out += _walk(sub, f"{path}.{name}" if path else name)
    if isinstance(node.get("items"), dict):
        out += _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        out += _walk(node["additionalProperties"], f"{path}{{}}")
    return out


# --- every CEL rule of the CRD has its Python twin --------------------------------------------------------


def test_every_cel_rule_in_the_crd_has_its_python_twin(capsys: pytest.CaptureFixture[str]) -> None:
    in_crd = sorted(
        (path, v["rule"], v["message"], v.get("fieldPath", ""))
        for path, node in _walk(_crd_schema(), "")
        for v in node.get("x-kubernetes-validations", [])
    )
    twins = sorted(
        (place, r.cel, r.message, r.field or "")
        for r in admission.all_rules()
        for place in r.places
        if callable(r.check)
    )
    with capsys.disabled():
        print(
            f"\nCRD file: {len(in_crd)} CEL rules ({sum(r.old for r in admission.all_rules())} on update); "
            f"Python twins: {len(twins)}"
        )
    assert in_crd == twins


def test_every_cel_rule_is_broken_by_some_case_of_the_admission_table() -> None:
    """Each rule, at each of its places, meets a manifest its Python twin refuses; the integration test
    sends the same manifests to the API server."""
    broken: set[tuple[int, str]] = set()
    for case in INVALID:
        try:
            job = spec.FineTuneJob.model_validate(case.manifest(), context={rules.ADMITTED: True})
        except ValidationError:
            continue  # refused for its type, pattern or bounds: no rule runs
        wire = job.model_dump(by_alias=True, exclude_none=True, mode="json")
        for i, rule in enumerate(admission.all_rules()):
            for place in rule.places:
                if not rule.old and any(not rule.check(v) for _, v in rules.instances(wire, place)):
                    broken.add((i, place))
    wanted = {(i, p) for i, r in enumerate(admission.all_rules()) if not r.old for p in r.places}
    missing = [(admission.all_rules()[i].message, p) for i, p in sorted(wanted - broken)]
    assert not missing


def test_transition_rules_have_twins_too() -> None:
    old = spec.FineTuneJobSpec.model_validate(BASE["spec"]).wire()
    changes = {
        "model": {"name": "Qwen/Qwen3-8B", "revision": "main", "trustRemoteCode": False},
        "training": {**old["training"], "learningRate": 0.5},
        "method": "lora",
        "resources": {**old["resources"], "gpusPerNode": 2},
        "image": "trainer:2",
        "env": [{"name": "NCCL_DEBUG", "value": "INFO"}],
        "registration": {**old["registration"], "modelName": "other"},
    }
    for key, value in changes.items():
        new = {**copy.deepcopy(old), key: value}
        problems = admission.check_update(old, new)
        assert problems and all("is immutable once created" in p for p in problems), key
        assert any(p.startswith(f"spec.{key}") for p in problems), (key, problems)
    # suspend, enabled and the alias may change
    new = {
        **copy.deepcopy(old),
        "suspend": True,
        "registration": {**old["registration"], "alias": "prod", "enabled": False},
    }
    assert admission.check_update(old, new) == []


def test_the_gate_and_the_checkpoint_choice_cannot_be_loosened_after_creation() -> None:
    """Adding, removing or changing the gate, or what is registered, is refused by its name."""
    gated = {**BASE["spec"], "dataset": {**BASE["spec"]["dataset"], "evalFraction": 0.1}}
    gated["registration"] = {**gated.get("registration", {}), "gate": {"maxEvalLoss": 1.5}}
    old = spec.FineTuneJobSpec.model_validate(gated).wire()
    for registration, field in [
        ({"gate": {"maxEvalLoss": 9.0}}, "spec.registration.gate"),
        ({"gate": None}, "spec.registration.gate"),
        ({"select": "bestEval"}, "spec.registration.select"),
    ]:
        new = copy.deepcopy(old)
        new["registration"].update(registration)
        new["registration"] = {k: v for k, v in new["registration"].items() if v is not None}
        assert admission.check_update(old, new) == [
            f"{field}: {field} is immutable once created (only registration.enabled and registration.alias may change)"
        ]
    # adding one where there was none is a change too
    ungated = copy.deepcopy(old)
    del ungated["registration"]["gate"]
    assert [p.split(":")[0] for p in admission.check_update(ungated, old)] == ["spec.registration.gate"]


def test_the_mutable_fields_are_one_list_and_the_guide_says_it() -> None:
    """The transition rules cover every spec field but the declared mutable paths, and docs/guide.md
    states the same list the reference is generated from."""
    from kubetune_api.docs import mutable_sentence

    covered = {r.field.lstrip(".") for r in admission.all_rules() if r.old and r.field}
    walked = {p.split(".")[0] for p in covered}
    top = {wire for wire, _, _ in admission.fields_of(spec.FineTuneJobSpec)}
    assert walked | {"suspend"} == top
    assert not covered & set(spec.MUTABLE_SPEC_PATHS)
    registration = {wire for wire, _, _ in admission.fields_of(spec.RegistrationSpec)}
    assert {f"registration.{w}" for w in registration} - covered == {
        "registration.enabled",
        "registration.alias",
    }
    guide = " ".join((Path(__file__).resolve().parents[2] / "docs" / "guide.md").read_text().split())
    assert mutable_sentence() in guide


# --- every OpenAPI constraint of the CRD has its twin in pydantic ----------------------------------------


def _violations(path: str, node: dict[str, Any]) -> list[tuple[str, Any]]:
    """(constraint, a value that breaks it) for each constraint the schema puts on ``node``."""
    out: list[tuple[str, Any]] = []
    kind = node.get("type")
    if "pattern" in node:
        limit = node.get("maxLength", 1000)
        candidates = ["", " ", "a b", "x\ny", "-", "!", "A", "..", "ab:c", "Ab/", "a/../b"]
        bad = next(c for c in candidates if len(c) <= limit and not re.search(node["pattern"], c))
        out.append(("pattern", bad))
    if "maxLength" in node:
        out.append(("maxLength", "a" * (node["maxLength"] + 1)))
    if node.get("minLength"):
        out.append(("minLength", ""))
    if "enum" in node:
        out.append(("enum", "not-one-of-them"))
    if kind in ("integer", "number"):
        if "minimum" in node:
            lo = node["minimum"]
            out.append(("minimum", lo if node.get("exclusiveMinimum") else lo - 1))
        if "maximum" in node:
            hi = node["maximum"]
            out.append(("maximum", hi if node.get("exclusiveMaximum") else hi + 1))
        out.append(("type", "many"))
    elif kind == "boolean":
        out.append(("type", "maybe"))
    elif kind == "string":
        out.append(("type", ["a list"]))
    elif kind == "array":
        out.append(("type", "not a list"))
        if "maxItems" in node:
            item = "x" if node.get("items", {}).get("type") == "string" else {}
            out.append(
                (
                    "maxItems",
                    [f"{item}{i}" if isinstance(item, str) else {} for i in range(node["maxItems"] + 1)],
                )
            )
        if node.get("minItems"):
            out.append(("minItems", []))
        if node.get("x-kubernetes-list-type") == "set":
            out.append(("list-type set", ["q_proj", "q_proj"]))
        if node.get("x-kubernetes-list-type") == "map":
            out.append(("list-type map", [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]))
    elif kind == "object":
        out.append(("type", "not an object"))
        if "maxProperties" in node:
            out.append(("maxProperties", {f"k{i}": "v" for i in range(node["maxProperties"] + 1)}))
        for key in node.get("required", []):
            out.append((f"required {key}", {}))
    return out


def _put(doc: dict[str, Any], path: str, value: Any) -> str:
    """Put ``value`` at ``path`` (creating what leads there); the path the refusal must name."""
    parts = re.findall(r"[^.\[\]{}]+|\[\]|\{\}", path)
    node: Any = doc
    named = ""
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if part == "[]":
            if last:
                node[:] = [value]
            else:
                if not node:
                    node.append({})
                node = node[0]
            named += "[0]"
            continue
        if part == "{}":
            node["k"] = value  # a map's value: named by the map
            return named
        if last:
            node[part] = value
        else:
            follow = parts[i + 1]
            default: Any = [] if follow == "[]" else {}
            if not isinstance(node.get(part), type(default)):
                node[part] = default
            node = node[part]
        named += f".{part}" if named else part
    return named


def test_every_openapi_constraint_in_the_crd_has_its_python_twin(capsys: pytest.CaptureFixture[str]) -> None:
    """For each constraint the CRD's schema puts on a spec field, a value breaking it is refused by the
    Python check, naming the field."""
    spec_schema = _crd_schema()["properties"]["spec"]
    checked, missed = 0, []
    for path, node in _walk(spec_schema, "spec"):
        for constraint, value in _violations(path, node):
            doc = copy.deepcopy(BASE)
            named = _put(doc, path, value)
            problems = admission.problems(doc)
            checked += 1
            if not any(p.startswith(named) for p in problems):
                missed.append((path, constraint, value, problems))
    with capsys.disabled():
        print(f"\nCRD file: {checked} OpenAPI constraints on spec fields; each refused by the Python check")
    assert checked > 150
    assert not missed


# --- the admission table through the Python check -----------------------------------------------------------


@pytest.mark.parametrize("case", INVALID, ids=[c.id for c in INVALID])
def test_refused_by_python_naming_the_field(case: Case) -> None:
    problems = admission.problems(case.manifest())
    assert any(case.field in p for p in problems), problems


@pytest.mark.parametrize("case", VALID, ids=[c.id for c in VALID])
def test_edge_values_admitted_by_python(case: Case) -> None:
    assert admission.problems(case.manifest()) == []


# --- everything that reads a manifest applies the rules -----------------------------------------------------


def _write(tmp_path: Path, doc: dict[str, Any]) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize(
    "case",
    [
        c
        for c in INVALID
        if c.id
        in {
            "epochs-and-max-steps",
            "dataset-name-and-path",
            "env-kubetune-config",
            "cpu-zero",
            "env-duplicate",
        }
    ],
    ids=lambda c: c.id,
)
def test_kubetune_render_refuses_what_the_api_server_refuses(tmp_path: Path, case: Case) -> None:
    path = _write(tmp_path, case.manifest())
    out = subprocess.run(
        [sys.executable, "-m", "kubetune_cli", "render", str(path)],
        check=False,
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert out.returncode == 2, out.stdout
    assert out.stdout == ""
    assert f"{path}: {case.field}" in out.stderr, out.stderr


def test_load_manifest_names_the_file_and_every_broken_rule(tmp_path: Path) -> None:
    doc = copy.deepcopy(BASE)
    doc["spec"]["training"]["epochs"] = 1
    doc["spec"]["env"] = [{"name": "LD_PRELOAD", "value": "/x.so"}, {"name": "X", "value": "https://u:pw@h"}]
    path = _write(tmp_path, doc)
    with pytest.raises(rules.RuleError) as refused:
        load_manifest(path)
    assert [p.split(":")[0] for p in refused.value.problems] == [
        "spec.training",
        "spec.env[1].value",
        "spec.env[0].name",
    ]
    assert all(line.startswith(f"{path}: spec.") for line in str(refused.value).splitlines())
    assert "pw" not in str(refused.value)  # the value is never repeated


def test_every_rendered_pod_defines_each_variable_once() -> None:
    """The pod of an env naming KUBETUNE_CONFIG got it twice; now refused, and the rendered examples
    define every variable once in every container."""
    from kubetune_cli.render import render

    for example in sorted((REPO / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(render(example)):
            for container in _containers(doc):
                names = [e["name"] for e in container.get("env", [])]
                assert len(names) == len(set(names)), (example.name, names)


def _containers(obj: Any) -> list[dict[str, Any]]:
    out = []
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key in ("containers", "initContainers") and isinstance(value, list):
                out += value
            else:
                out += _containers(value)
    elif isinstance(obj, list):
        for item in obj:
            out += _containers(item)
    return out


def test_the_rules_know_every_variable_and_mount_kubetune_sets() -> None:
    """POD_ENV, OPERATOR_ENV and KUBETUNE_MOUNTS against what the builders really put in the pods (with
    every secret set, multi-node, registration on): a name a builder adds later must join the rules."""
    from kubetune_operator.builders import build_children
    from kubetune_operator.settings import Settings

    doc = yaml.safe_load((REPO / "examples" / "multinode-lora.yaml").read_text())
    doc["spec"].pop("env", None)  # only what kubetune itself sets
    ref = {"name": "s", "key": "k"}
    doc["spec"]["secrets"] = {
        "huggingFaceToken": ref,
        "mlflowTrackingToken": ref,
        "mlflowTrackingUsername": ref,
        "mlflowTrackingPassword": ref,
    }
    job = spec.parse_job(doc)
    names: set[str] = set(rules.TRAINING_OPERATOR_ENV)
    mounts: set[str] = set()
    for obj in build_children(job, Settings.from_env(), registration=True):
        for container in _containers(obj):
            names |= {e["name"] for e in container.get("env", [])}
            mounts |= {m["mountPath"] for m in container.get("volumeMounts", [])}
    known = set(rules.POD_ENV) | set(spec.OPERATOR_ENV) | set(pod_env.DEFAULTED_ENV)
    assert names <= known, names - known
    assert not [n for n in names if pod_env.reserved(n) is None]  # and spec.env may set none of them
    assert mounts <= set(rules.KUBETUNE_MOUNTS), mounts


def test_the_operator_and_the_trainer_apply_the_rules(tmp_path: Path) -> None:
    doc = copy.deepcopy(BASE)
    doc["spec"]["resources"]["memory"] = "0"
    # the operator: a job not started yet is refused naming the field; a started one keeps parsing
    with pytest.raises(ValidationError, match=r"spec\.resources\.memory"):
        spec.parse_job(doc)
    assert spec.parse_job({**doc, "status": {"phase": "Training"}}).spec.resources.memory == "0"
    # the trainer: a config carrying such a spec is refused when loaded
    good = spec.parse_job(BASE)
    text = resolve(good).to_yaml().replace("memory: 128Gi", "memory: '0'")
    (tmp_path / "config.yaml").write_text(text)
    with pytest.raises(ValidationError, match=r"spec\.resources\.memory must be a Kubernetes quantity"):
        TrainerConfig.load(tmp_path / "config.yaml")


def test_tracking_uri_flag_gets_the_same_check() -> None:
    assert spec.registration_error(None, "https://h/?token=abc") is not None
    assert spec.registration_error(None, "https://u:p@h") is not None
    assert spec.registration_error(None, "https://h/?workspace=a") is None


def test_registry_uri_gets_the_tracking_uris_credential_rules() -> None:
    """The twin of the CEL rules on spec.registration.registryUri: the message names the field."""
    bad = {"https://u:p@registry.example.com": "user:password@", "https://h/?access_token=abc": "query"}
    for uri, what in bad.items():
        problems = [r for r in rules.rules_at("spec.registration") if not r.check({"registryUri": uri})]
        assert problems, uri
        assert all(r.message.startswith("spec.registration.registryUri ") for r in problems), what
        assert all(uri not in r.message for r in problems)
    for uri in ("databricks-uc", "databricks-uc://prod", "https://h/?workspace=a", "sqlite:///r.db"):
        assert all(r.check({"registryUri": uri}) for r in rules.rules_at("spec.registration")), uri


def test_cel_patterns_fit_in_single_quoted_cel_strings() -> None:
    for name in (
        "LABEL_KEY",
        "UNCLEAN_PATH",
        "CLIMBS_OUT",
        "BAD_GIT_REF",
        "URI_USERINFO",
        "URI_CREDENTIALS",
        "QUERY_CREDENTIAL",
    ):
        assert not set("'\\") & set(getattr(cel, name)), name
    for name in dir(cel):  # the two-engine patterns go into raw CEL strings r'...'
        if isinstance(getattr(cel, name), cel.Pattern):
            assert "'" not in getattr(cel, name).re2, name
    for reserved in pod_env.RESERVED_ENV:
        assert not set("'\\") & set(reserved.pattern + (reserved.allowed or "")), reserved.what
    assert not set("'\\") & set(spec.NAME_PATTERN + cel.SECRET_LIKE_ENV)


def test_docs_list_every_rule() -> None:
    from kubetune_api.docs import markdown_cell

    text = (REPO / "docs" / "api.md").read_text()
    for rule in admission.all_rules():
        assert markdown_cell(rule.message) in text, rule.message


def test_the_guide_points_at_the_generated_table_and_the_docs_state_the_minimum() -> None:
    # the README's configuration reference and install sections are docs/guide.md and docs/install.md
    guide = (REPO / "docs" / "guide.md").read_text()
    install = (REPO / "docs" / "install.md").read_text()
    docs = (REPO / "docs" / "api.md").read_text()
    assert "(api.md#validation-rules)" in guide and "\n## Validation rules\n" in docs
    assert "cluster (1.30 or newer)" in install and "Kubernetes 1.30, the documented minimum" in guide
    # the CEL uses nothing newer than 1.30 has: no format library (1.32)
    assert not [r.cel for r in admission.all_rules() if "format." in r.cel]


def test_both_spellings_of_a_name_pattern_say_the_same() -> None:
    """RE2's spelling (\\x{200B}) and Python's (\\U0000200B) come from one table: Python's, and the
    RE2 one read by Python after the one change of syntax, agree on every code point of the table and
    its neighbours (the real API server reads RE2's: tests/integration/test_admission_table.py)."""
    re2_in_python = re.sub(r"\\x\{([0-9A-F]{4,6})\}", lambda m: f"\\U{int(m[1], 16):08X}", cel.UNSEEN.re2)
    edges = {c + d for a, b in (*cel.UNSEEN_RANGES, *cel.SPACE_RANGES) for c in (a, b) for d in (-1, 0, 1)}
    for point in sorted(p for p in edges if p >= 0):
        inside = any(a <= point <= b for a, b in cel.UNSEEN_RANGES)
        assert cel.UNSEEN.search(f"a{chr(point)}b") is inside, hex(point)
        assert (re.search(re2_in_python, chr(point)) is not None) is inside, hex(point)
    assert not cel.EDGE_SPACE.search("a b") and cel.EDGE_SPACE.search("a\u3000")


def test_credentials_by_shape_are_refused_without_echoing_the_value() -> None:
    """Each kind of cel.CREDENTIAL_SHAPES is refused in an env value and a reference field, by a
    message that names the field and not the value."""
    samples = {
        "hf_": "hf_" + "a1B2" * 9,
        "ghp_/github_pat_": "github_pat_" + "A1_" * 10,
        "sk-": "sk-" + "a1" * 12,
        "AKIA/ASIA": "ASIAIOSFODNN7EXAMPLE",
        "xox?-": "xoxa-123456789012",
        "ya29.": "ya29." + "a0" * 15,
        "a JWT": "eyJ" + "a" * 10 + ".eyJ" + "b" * 10,
        "sig=": "https://a.example/c?sv=1&sig=xyz",
        "X-Amz-Signature": "https://b.example/k?X-Amz-Signature=ab",
        "X-Goog-Signature": "https://c.example/o?X-Goog-Credential=ab",
    }
    assert set(samples) == {kind for kind, _ in cel.CREDENTIAL_SHAPES}
    for kind, value in samples.items():
        doc = copy.deepcopy(BASE)
        doc["spec"]["env"] = [{"name": "PLAIN", "value": value}]
        problems = admission.problems(doc)
        assert problems and all(p.startswith("spec.env[0].value") for p in problems), (kind, problems)
        assert any(kind in p for p in problems) and not any(value in p for p in problems), (kind, problems)
        doc = copy.deepcopy(BASE)
        doc["spec"]["registration"]["experiment"] = f"runs-{value}"
        problems = admission.problems(doc)
        assert {p.split(":")[0] for p in problems} == {"spec.registration.experiment"}, (kind, problems)
        assert not any(value in p for p in problems)


@pytest.mark.parametrize(
    "point",
    [
        0xAD,
        0x061C,
        0x115F,
        0x1160,
        0x180E,
        0x2060,
        0x2064,
        0x3164,
        0xFE00,
        0xFE0F,
        0xFFA0,
        0xE0000,
        0xE0041,
        0xE007F,
    ],
)
def test_invisible_fillers_joiners_selectors_and_tags_are_unseen_in_both_spellings(point: int) -> None:
    assert cel.UNSEEN.search(f"qw{chr(point)}en")
    # RE2 spells an astral code point with more than four hex digits: \x{E0000}
    assert f"\\x{{{point:04X}}}" in cel.UNSEEN.re2 or any(a < point <= b for a, b in cel.UNSEEN_RANGES)
    assert f"U+{point:04X}" in cel.UNSEEN_MESSAGE or any(a < point <= b for a, b in cel.UNSEEN_RANGES)


def test_the_python_twins_fold_case_as_the_api_servers_regexp() -> None:
    """Go's regexp (CEL's matches()) folds the Kelvin sign and the long s with k and s, but not the
    Turkish dotless and dotted i (U+0131, U+0130) with i and I, which Python's re folds: the twins must say what the API server says."""
    from kubetune_api import pod_env

    assert cel.re2_search("(?i)^KUBETUNE_", "\u212aubetune_config")  # Kelvin sign: folded by both
    assert not cel.re2_search("(?i)^PIP$", "P\u0130P") and not cel.re2_search("(?i)^PIP$", "p\u0131p")
    assert pod_env.reserved("NV\u0130DIA_VISIBLE_DEVICES") is None
    assert pod_env.reserved("nv\u0131dia_visible_devices") is None
    assert pod_env.reserved("nvidia_visible_devices") is not None
    assert pod_env.reserved("\u212aUBETUNE_CONFIG") is not None


def test_a_key_set_to_null_is_absent_as_for_cel_has() -> None:
    assert not cel._has({"value": None}, "value")
    assert cel._has({"value": ""}, "value")
    assert not cel._has({}, "value") and not cel._has(None, "value")
