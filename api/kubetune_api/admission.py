"""What the API server admits, in Python, for a whole FineTuneJob: every rule of
:mod:`kubetune_api.rules` (with :mod:`kubetune_api.rules_lineage`), the transition rules built from
the spec's fields (what is immutable), and the list types of the schema.

The rules are declared below the spec (its validators apply them, :func:`kubetune_api.rules.check`);
this module, above the spec, is where the rules meet the spec's own model: the CRD generator
(:mod:`kubetune_api.crd`), the reference (:mod:`kubetune_api.docs`) and the trainer's config loader
list and check through it.

    python -m kubetune_api.admission      # one line per rule: where, CEL, message
"""

from __future__ import annotations

import functools
import typing
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic.alias_generators import to_camel

from . import rules
from .rules import ADMITTED, Rule
from .schema import schema_at, schema_problems, structural
from .spec import MUTABLE_SPEC_PATHS, FineTuneJob, FineTuneJobSpec
from .status import FineTuneJobStatus


def fields_of(model: type[BaseModel]) -> list[tuple[str, bool, type[BaseModel] | None]]:
    """Each field of ``model``: its wire name, whether it is required, and its own model (an object
    field: ``RegistrationSpec``, ``GateSpec | None``), else None."""
    out = []
    for name, info in model.model_fields.items():
        args = typing.get_args(info.annotation) or (info.annotation,)
        sub = next((a for a in args if isinstance(a, type) and issubclass(a, BaseModel)), None)
        out.append((info.alias or to_camel(name), info.is_required(), sub))
    return out


def immutable_parts(
    model: type[BaseModel] = FineTuneJobSpec, mutable: tuple[str, ...] = MUTABLE_SPEC_PATHS, under: str = ""
) -> list[tuple[tuple[tuple[str, bool], ...], tuple[str, ...]]]:
    """What may not change after creation, walked from the spec's model and the one list of what may
    (:data:`kubetune_api.spec.MUTABLE_SPEC_PATHS`): each part as its path from spec (each step's wire
    name and whether it is required) and the paths that may change beside it (for its message). A
    field that holds a mutable path is not one part: each of its own fields is (and so on down)."""
    out: list[tuple[tuple[tuple[str, bool], ...], tuple[str, ...]]] = []
    for wire, required, sub in fields_of(model):
        path = f"{under}{wire}"
        if path in mutable:
            continue
        below = tuple(m for m in mutable if m.startswith(path + "."))
        if below and sub is not None:
            for steps, beside in immutable_parts(sub, mutable, path + "."):
                out.append((((wire, required), *steps), beside))
        else:
            siblings = tuple(m for m in mutable if under and m.startswith(under))
            out.append((((wire, required),), siblings))
    return out


@functools.cache
def all_rules() -> tuple[Rule, ...]:
    """Every rule, in the order the CRD lists them at each place: the rules on one object, then the
    transition rules (oldSelf)."""
    return (*rules.object_rules(), *rules.immutable_rules(immutable_parts()))


def root_schema() -> dict[str, Any]:
    """The structural schema of a FineTuneJob's spec and status (what the list types are read from)."""
    return {
        "type": "object",
        "properties": {"spec": structural(FineTuneJobSpec), "status": structural(FineTuneJobStatus)},
    }


def check(obj: dict[str, Any], *, under: str = "", only_root: bool = False) -> list[str]:
    """:func:`kubetune_api.rules.check` on ``obj`` at ``under`` of a FineTuneJob (the whole object by
    default), with the list types of the FineTuneJob's schema there."""
    return rules.check(obj, schema_at(root_schema(), under), under=under, only_root=only_root)


def check_update(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The transition rules an update of spec from ``old`` to ``new`` breaks (what is immutable)."""
    return [
        f"spec{rule.field}: {rule.message}" for rule in all_rules() if rule.old and not rule.check(new, old)
    ]


def problems(doc: dict[str, Any]) -> list[str]:
    """Every reason the API server would refuse the FineTuneJob ``doc``, as ``path: what`` lines:
    its schema (types, enums, bounds, patterns, unknown fields: pydantic, from the same declarations
    as the CRD's OpenAPI schema), then every CEL rule and list type. Empty: admitted."""
    try:
        job = FineTuneJob.model_validate(doc, context={ADMITTED: True})
    except ValidationError as e:
        return schema_problems(e)
    return check(job.model_dump(by_alias=True, exclude_none=True, mode="json"))


def main() -> int:
    for rule in all_rules():
        for place in rule.places:
            kind = "CEL on update" if rule.old else "CEL"
            print(f"{place or '(root)'}{rule.field or ''}\t{kind}\t{rule.cel}\t{rule.message}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
