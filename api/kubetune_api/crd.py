"""Generate the FineTuneJob CustomResourceDefinition from the typed models in ``spec``.

    python -m kubetune_api.crd > crds/kubetune.io_finetunejobs.yaml
    python -m kubetune_api.crd --check crds/kubetune.io_finetunejobs.yaml   # exit 1 on drift

The generator turns pydantic's JSON Schema into a Kubernetes structural schema: references are
inlined, optionals lose their ``null`` branch, exclusive bounds become OpenAPI v3.0 booleans,
defaults of nested objects become ``{}`` so that the API server fills their fields (and CEL rules
can rely on them), and the CEL rules declared in ``rules`` become ``x-kubernetes-validations`` at
each of their places.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from . import rules
from . import spec as api
from .status import FineTuneJobStatus

# JSON Schema keys that carry over unchanged into the OpenAPI v3 structural schema.
_KEEP = {
    "type",
    "description",
    "default",
    "enum",
    "format",
    "pattern",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "required",
    "x-kubernetes-validations",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
}


def _inlined(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """``node`` with its ``$ref`` put in place and its nullable union (``X | None``) reduced to ``X``."""
    node = dict(node)
    if "$ref" in node:
        target = copy.deepcopy(defs[node.pop("$ref").split("/")[-1]])
        target.update(node)  # field-level description/default win over the model's
        node = target
    if "anyOf" in node:
        branches = [b for b in node.pop("anyOf") if b.get("type") != "null"]
        if len(branches) != 1:
            raise ValueError(f"unions are not structural: {branches}")
        inner = _structural(branches[0], defs)
        # the field's own keys (description, validations) sit beside anyOf
        merged_validations = inner.get("x-kubernetes-validations", []) + node.pop(
            "x-kubernetes-validations", []
        )
        inner.update({k: v for k, v in node.items() if k != "default" or v is not None})
        if merged_validations:
            inner["x-kubernetes-validations"] = merged_validations
        node = inner
    return node


def _structural(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    node = _inlined(node, defs)
    if "const" in node:
        node["enum"] = [node.pop("const")]
    # JSON Schema's numeric exclusive bounds become OpenAPI v3.0's boolean flags (once).
    for bound, flag in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if flag in node and not isinstance(node[flag], bool):
            node[bound] = node.pop(flag)
            node[flag] = True
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _KEEP or key in {"exclusiveMinimum", "exclusiveMaximum"}:
            out[key] = value
    if node.get("default", 0) is None:
        out.pop("default", None)
    if "properties" in node:
        out["type"] = "object"
        out["properties"] = {name: _structural(sub, defs) for name, sub in node["properties"].items()}
    if "items" in node:
        out["items"] = _structural(node["items"], defs)
    if isinstance(node.get("additionalProperties"), dict):
        out["additionalProperties"] = _structural(node["additionalProperties"], defs)
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    if out.get("type") == "object" and "default" in out and out["default"]:
        # Nested object defaults: let the API server fill each field from its own default.
        out["default"] = {}
    return out


def _model_schema(model: type[BaseModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    return _structural(raw, defs)


def _add_factory_defaults(schema: dict[str, Any], model: type[BaseModel]) -> None:
    """pydantic leaves default_factory values out of JSON Schema; put them in."""
    for name, info in model.model_fields.items():
        wire = info.alias or name
        sub = schema.get("properties", {}).get(wire)
        if sub is None:
            continue
        annotation = info.annotation
        nested = _pydantic_model_of(annotation)
        if info.default_factory is not None:
            value = info.default_factory()  # type: ignore[call-arg]
            sub["default"] = {} if isinstance(value, BaseModel) else value
        if nested is not None:
            _add_factory_defaults(sub, nested)


def _pydantic_model_of(annotation: Any) -> type[BaseModel] | None:
    import typing

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _pydantic_model_of(arg)
        if found is not None:
            return found
    return None


def _schema_node(root: dict[str, Any], place: str) -> dict[str, Any]:
    """The schema of a rule's place (``spec.env[]``: the items of spec.env)."""
    node = root
    for part in filter(None, place.split(".")):
        node = node["properties"][part.removesuffix("[]")]
        if part.endswith("[]"):
            node = node["items"]
    return node


def _attach_rules(root: dict[str, Any]) -> None:
    for rule in rules.all_rules():
        for place in rule.places:
            node = _schema_node(root, place)
            node.setdefault("x-kubernetes-validations", []).append(rule.validation())


def openapi_schema() -> dict[str, Any]:
    spec_schema = _model_schema(api.FineTuneJobSpec)
    _add_factory_defaults(spec_schema, api.FineTuneJobSpec)
    status_schema = _model_schema(FineTuneJobStatus)
    root = {
        "type": "object",
        "description": "FineTuneJob fine-tunes a language model on a data set and registers it in MLflow.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec_schema,
            "status": status_schema,
        },
    }
    _attach_rules(root)
    return root


PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {
        "name": "Progress",
        "type": "integer",
        "jsonPath": ".status.progress.percent",
        "description": "Percent of planned training steps done",
    },
    {"name": "Loss", "type": "number", "jsonPath": ".status.progress.loss"},
    {
        "name": "Tokens",
        "type": "integer",
        "jsonPath": ".status.preparation.data.tokens",
        "description": "Training tokens per epoch (preparation)",
    },
    {
        "name": "Est-GPU-h",
        "type": "number",
        "jsonPath": ".status.preparation.estimate.gpuHours",
        "description": "Estimated GPU-hours (preparation)",
    },
    {
        "name": "Reason",
        "type": "string",
        "jsonPath": ".status.conditions[?(@.type=='Ready')].reason",
        "priority": 1,
    },
    {"name": "Model", "type": "string", "jsonPath": ".status.registeredModel.name"},
    {"name": "Version", "type": "string", "jsonPath": ".status.registeredModel.version"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def build_crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{api.PLURAL}.{api.GROUP}",
            "labels": {"app.kubernetes.io/name": "kubetune", "app.kubernetes.io/part-of": "kubetune"},
        },
        "spec": {
            "group": api.GROUP,
            "names": {
                "kind": api.KIND,
                "listKind": f"{api.KIND}List",
                "plural": api.PLURAL,
                "singular": api.SINGULAR,
                "shortNames": list(api.SHORT_NAMES),
                "categories": ["kubetune"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": api.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                }
            ],
        },
    }


HEADER = (
    "# Generated by `python -m kubetune_api.crd` from api/kubetune_api/spec.py and rules.py. Do not edit.\n"
)


def render() -> str:
    return HEADER + yaml.safe_dump(build_crd(), sort_keys=False, width=120)


def generated_file_main(argv: list[str] | None, *, doc: str | None, module: str, render_text: str) -> int:
    """The CLI shared by generated files: print, ``--write FILE``, or ``--check FILE`` (exit 1 if stale)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", type=Path, help="compare with this file; exit 1 when it differs")
    parser.add_argument("--write", type=Path, help="write the generated text to this file")
    args = parser.parse_args(argv)
    if args.check:
        if args.check.read_text() != render_text:
            print(
                f"{args.check} is out of date: run python -m {module} --write {args.check}", file=sys.stderr
            )
            return 1
        return 0
    if args.write:
        args.write.write_text(render_text)
        return 0
    sys.stdout.write(render_text)
    return 0


def main(argv: list[str] | None = None) -> int:
    return generated_file_main(argv, doc=__doc__, module="kubetune_api.crd", render_text=render())


if __name__ == "__main__":
    sys.exit(main())
