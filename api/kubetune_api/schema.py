"""The schema side of admission, in Python: the typed models' JSON Schema as a Kubernetes structural
schema (what the CRD's OpenAPI schema is made of), its list types (``x-kubernetes-list-type``), and
the paths of pydantic's errors, written as the API server writes them.

The CEL rules and their Python twins are :mod:`kubetune_api.rules`; this module is what the schema
itself says, checked where no API server is (``kubetune render``, the trainer's data check). It
imports no other module of the API: the spec's validators and the CRD generator both build on it.
"""

from __future__ import annotations

import copy
import functools
import re
import typing
from typing import Any

from pydantic import BaseModel

# JSON Schema keys that carry over unchanged into the OpenAPI v3 structural schema.
_KEEP = {
    "type",
    "nullable",
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
        if node.get("default", 0) is None:
            # An optional field (``X | None = None``): an explicit null means "not set", whichever way
            # the manifest comes in. Without nullable, kubectl create drops the null but server-side
            # apply refuses it ("must be of type object"); with it, both keep it, and every CEL rule
            # reads it as absent (has() is false), as the Python models do (ApiModel._null_is_unset).
            # A field with a default needs none: both drop its null and default it.
            inner["nullable"] = True
            if "enum" in inner:
                # The API server checks a null against an enum and refuses it (also when the enum
                # lists null); a pattern it checks only on strings: the same values, as a pattern.
                values = inner.pop("enum")
                inner["pattern"] = "^(" + "|".join(re.escape(str(v)) for v in values) + ")$"
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


def add_factory_defaults(schema: dict[str, Any], model: type[BaseModel]) -> None:
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
            add_factory_defaults(sub, nested)


def _pydantic_model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _pydantic_model_of(arg)
        if found is not None:
            return found
    return None


@functools.cache
def structural(model: type[BaseModel]) -> dict[str, Any]:
    """``model``'s JSON Schema as a Kubernetes structural schema (references inlined, optionals
    without their ``null`` branch, OpenAPI v3.0 bounds). Cached: copy it before changing it."""
    return _model_schema(model)


def schema_at(schema: dict[str, Any], place: str) -> dict[str, Any]:
    """The node of ``schema`` at ``place`` (``spec.training``)."""
    node = schema
    for part in filter(None, place.split(".")):
        node = node["properties"][part]
    return node


def list_type_problems(value: Any, schema: dict[str, Any], path: str) -> list[str]:
    """The Python twin of ``x-kubernetes-list-type`` anywhere in ``schema``: the items of a ``set``
    and the keys of a ``map`` list's items are unique (the API server: "Duplicate value")."""
    out: list[str] = []
    if isinstance(value, dict):
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                out += list_type_problems(value[key], sub, f"{path}.{key}" if path else key)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key, item in value.items():
                out += list_type_problems(item, extra, f"{path}[{key}]")
    elif isinstance(value, list):
        kind = schema.get("x-kubernetes-list-type")
        keys = schema.get("x-kubernetes-list-map-keys", [])
        seen: set[str] = set()
        for i, item in enumerate(value):
            identity = repr([item.get(k) for k in keys]) if kind == "map" else repr(item)
            if kind in ("set", "map") and identity in seen:
                what = ", ".join(f"{k}={item.get(k)!r}" for k in keys) if kind == "map" else repr(item)
                out.append(f"{path}[{i}]: Duplicate value: {what} is already in the list")
            seen.add(identity)
            out += list_type_problems(item, schema.get("items", {}), f"{path}[{i}]")
    return out


def field_path(loc: tuple[Any, ...]) -> str:
    """``spec.env[0].name`` from a pydantic error location (type tags of unions left out)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in _BRANCH_TAGS or re.fullmatch(r"[a-z-]+\[.*\]", str(part)):
            continue  # the branch of a union pydantic tried, not a field
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(part)):
            out += f".{part}" if out else str(part)
        else:  # a map key
            out += f"[{part}]"
    return out


_BRANCH_TAGS = {"str", "int", "float", "bool", "none", "list", "dict", "literal"}


def schema_problems(error: Any) -> list[str]:
    """One ``path: what`` line per field a pydantic ``ValidationError`` names (values left out)."""
    out = []
    for err in error.errors(include_url=False):
        where = field_path(tuple(err.get("loc") or ()))
        text = "unknown field" if err.get("type") == "extra_forbidden" else str(err.get("msg"))
        out.append(f"{where}: {text}" if where else text)
    return list(dict.fromkeys(out))
