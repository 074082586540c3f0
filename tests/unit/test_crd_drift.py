"""The CRD in crds/ is generated from the typed models; these tests fail when the two disagree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from kubetune_api import crd, schema, spec, status

CRD_FILE = Path(__file__).resolve().parents[2] / "crds" / "kubetune.io_finetunejobs.yaml"


def test_committed_crd_matches_models() -> None:
    assert crd.main(["--check", str(CRD_FILE)]) == 0, "run: python -m kubetune_api.crd --write " + str(
        CRD_FILE
    )


def test_drift_check_fails_when_crd_differs(tmp_path: Path) -> None:
    stale = tmp_path / "crd.yaml"
    stale.write_text(CRD_FILE.read_text().replace("maxLength: 200", "maxLength: 201", 1))
    assert crd.main(["--check", str(stale)]) == 1


def test_drift_check_fails_when_model_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Adding a field to the model without regenerating the CRD is caught."""
    before = crd.render()
    original = crd.openapi_schema

    def with_extra_field() -> dict[str, Any]:
        schema = original()
        schema["properties"]["spec"]["properties"]["newField"] = {"type": "string"}
        return schema

    monkeypatch.setattr(crd, "openapi_schema", with_extra_field)
    (tmp_path / "crd.yaml").write_text(before)
    assert crd.main(["--check", str(tmp_path / "crd.yaml")]) == 1


def _schema_fields(schema: dict[str, Any], prefix: str = "") -> set[str]:
    out = set()
    for name, sub in schema.get("properties", {}).items():
        out.add(prefix + name)
        out |= _schema_fields(sub, prefix + name + ".")
        if "items" in sub:
            out |= _schema_fields(sub["items"], prefix + name + "[].")
    return out


def _is_list(annotation: Any) -> bool:
    import typing

    if typing.get_origin(annotation) is list:
        return True
    return any(_is_list(a) for a in typing.get_args(annotation))


def _model_fields(model: type[spec.BaseModel], prefix: str = "") -> set[str]:

    out = set()
    for name, info in model.model_fields.items():
        wire = info.alias or name
        out.add(prefix + wire)
        annotation = info.annotation
        nested = schema._pydantic_model_of(annotation)
        if nested is not None:
            is_list = _is_list(annotation)
            out |= _model_fields(nested, prefix + wire + ("[]." if is_list else "."))
    return out


def test_every_model_field_is_in_the_crd_and_back() -> None:
    committed = yaml.safe_load(CRD_FILE.read_text())
    schema = committed["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    assert _schema_fields(schema["spec"]) == _model_fields(spec.FineTuneJobSpec)
    assert _schema_fields(schema["status"]) == _model_fields(status.FineTuneJobStatus)


def test_every_spec_field_is_documented() -> None:
    committed = yaml.safe_load(CRD_FILE.read_text())
    schema = committed["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]

    def walk(node: dict[str, Any], path: str) -> list[str]:
        missing = [] if node.get("description") else [path]
        for name, sub in node.get("properties", {}).items():
            missing += walk(sub, f"{path}.{name}")
        if "items" in node and "properties" in node["items"]:
            missing += walk(node["items"], f"{path}[]")
        return missing

    assert walk(schema, "spec") == []


def test_model_rejects_what_the_schema_rejects() -> None:
    """The same rules hold for local runs, where no API server checks the manifest."""
    base = {
        "metadata": {"name": "ok"},
        "spec": {"model": {"name": "m/x"}, "dataset": {"name": "d/y"}, "training": {"maxSteps": 5}},
    }
    spec.FineTuneJob.model_validate(base)
    bad = yaml.safe_load(yaml.safe_dump(base))
    bad["spec"]["method"] = "full"
    bad["spec"]["lora"] = {"r": 4}
    with pytest.raises(ValidationError, match=r"spec\.lora is only allowed"):
        spec.FineTuneJob.model_validate(bad)
    bad = yaml.safe_load(yaml.safe_dump(base))
    bad["spec"]["training"]["learningRate"] = -1
    with pytest.raises(ValidationError, match="learningRate"):
        spec.FineTuneJob.model_validate(bad)
    bad = yaml.safe_load(yaml.safe_dump(base))
    bad["metadata"]["name"] = "x" * 41
    with pytest.raises(ValidationError, match=r"metadata\.name"):
        spec.FineTuneJob.model_validate(bad)


def test_reference_docs_match_models() -> None:
    from kubetune_api import docs

    path = CRD_FILE.parents[1] / "docs" / "api.md"
    assert docs.main(["--check", str(path)]) == 0, "run: python -m kubetune_api.docs --write docs/api.md"


def test_tuning_patterns_fit_in_a_single_quoted_cel_string() -> None:
    from kubetune_api.tuning import TUNING_ENV

    for name, (pattern, _) in TUNING_ENV.items():
        assert not set("'\\") & set(pattern), name


def test_the_docs_list_every_tuning_variable() -> None:
    from kubetune_api.tuning import TUNING_ENV

    page = (CRD_FILE.parents[1] / "docs" / "performance.md").read_text()
    missing = [name for name in TUNING_ENV if f"| `{name}` |" not in page]
    assert not missing, f"docs/performance.md's tuning-variable table lacks {missing}"
