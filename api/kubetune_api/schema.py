"""The schema side of admission, in Python: the list types of the CRD's OpenAPI schema
(``x-kubernetes-list-type``) and the paths of pydantic's errors, written as the API server writes them.

The CEL rules and their Python twins are :mod:`kubetune_api.rules`; this module is what the schema
itself says, checked where no API server is (``kubetune render``, the trainer's data check).
"""

from __future__ import annotations

import functools
import re
from typing import Any


@functools.cache
def openapi() -> dict[str, Any]:
    from .crd import openapi_schema

    return openapi_schema()


def schema_at(place: str) -> dict[str, Any]:
    node = openapi()
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
