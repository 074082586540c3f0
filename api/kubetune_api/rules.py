"""Every validation rule of the FineTuneJob API that a field's own type cannot say, declared once.

A :class:`Rule` carries both enforcers of one rule:

- the CEL expression the API server evaluates (``x-kubernetes-validations`` in the CRD, put there by
  :mod:`kubetune_api.crd` at each of the rule's places, with its ``fieldPath`` and a message that
  names the field), and
- its Python twin, evaluated on the same value the CEL ``self`` sees (the wire form, camelCase, with
  the API server's defaults filled in), used where no API server checks a manifest first: ``kubetune
  render``, ``kubetune run --local``, the trainer (:class:`~kubetune_api.trainer_config.TrainerConfig`),
  and the operator's parsing of a job that has not started yet (:func:`kubetune_api.spec.parse_job`).

What a field's type says (types, enums, lengths, bounds, patterns, required fields) is declared once
on the pydantic models in :mod:`kubetune_api.spec`: the CRD's OpenAPI constraints are generated from
them and pydantic enforces the same constraints in Python. The one structural rule pydantic has no
notion of, ``x-kubernetes-list-type`` (items of a ``set`` or keys of a ``map`` list are unique), is
checked in Python by walking the generated schema itself (:func:`list_type_problems`).

The CEL here stays within what Kubernetes 1.30 (the chart's documented minimum) offers: the quantity
library (1.28+), the extended strings library and RE2 ``matches()``; not the ``format`` library
(1.32+), whose checks are written as the same regular expressions the Python twin uses. Patterns go
into single-quoted CEL strings as they are: no quotes or backslashes (a test checks).

Layers (no import circles, checked by ``lint-imports``): the :class:`Rule` type and the patterns are
:mod:`kubetune_api.cel`'s, below this module; :mod:`kubetune_api.spec` validates with :func:`check`,
above it; :mod:`kubetune_api.admission`, above the spec, adds the transition rules built from the
spec's fields and checks whole manifests.

    python -m kubetune_api.admission      # one line per rule: where, CEL, message
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from typing import Any

from .cel import (
    BAD_GIT_REF,
    CLIMBS_OUT,
    CREDENTIAL_SHAPE,
    CREDENTIAL_SHAPE_KINDS,
    CREDENTIAL_SHAPES,
    MAX_NAME_LENGTH,
    NAME_PATTERN,
    QUERY_CREDENTIAL,
    SECRET_LIKE_ENV,
    UNCLEAN_PATH,
    URI_USERINFO,
    Rule,
    _cel_list,
    _has,
    _label_key_cel,
    _overlapping_cel,
    _search,
    label_key_ok,
    overlapping,
    positive_quantity,
)
from .pod_env import (
    POD_ENV,  # noqa: F401 (kubetune_api.rules.POD_ENV, as before pod_env)
    RESERVED_ENV,
    TRAINING_OPERATOR_ENV,  # noqa: F401 (kubetune_api.rules.TRAINING_OPERATOR_ENV, as before pod_env)
)
from .rules_ignored import ignored_rules
from .rules_lineage import lineage_rules, model_source_rule, name_rules, registration_rules
from .schema import list_type_problems
from .tuning import TUNING_ENV

# The ValidationInfo context key that says "this spec was admitted by an API server already": the
# operator's parsing of a job that started under an earlier version of the rules (see parse_job).
ADMITTED = "admitted"

# spec.lora.targetModules' one preset: every linear layer of the model but its output head (PEFT's own
# spelling, which the trainer hands to PEFT as it is); alone in the list
ALL_LINEAR = "all-linear"
# QLoRA: spec.lora.quantization nf4 (CEL, on spec)
_NF4_CEL = "has(self.lora) && self.lora.quantization == 'nf4'"

# Where kubetune mounts its own volumes in the trainer and registration pods: the checkpoint volume,
# the trainer config, the caches, /tmp and the memory-backed /dev/shm (kubetune_operator.builders)
KUBETUNE_MOUNTS = ("/var/lib/kubetune", "/etc/kubetune", "/var/cache/kubetune", "/tmp", "/dev/shm")


# --- the rules ---------------------------------------------------------------------------------------


def _source_rules(kind: str) -> list[Rule]:
    """spec.model and spec.dataset: a Hub id, or a path (on a volume)."""
    at = f"spec.{kind}"
    return [
        model_source_rule()
        if kind == "model"
        else Rule(
            (at,),
            "has(self.name) != has(self.path)",
            f"spec.{kind} needs exactly one of name (a Hugging Face Hub id) or path (a file or folder on a volume)",
            lambda s: _has(s, "name") != _has(s, "path"),
        ),
        Rule(
            (at,),
            "!has(self.volume) || has(self.path)",
            f"spec.{kind}.volume is only used with path",
            lambda s: not _has(s, "volume") or _has(s, "path"),
            field=".volume",
        ),
        Rule(
            (at,),
            "!has(self.path) || self.path.startsWith('/')",
            f"spec.{kind}.path must be absolute (where the volume is mounted, or a path inside the image)",
            lambda s: not _has(s, "path") or s["path"].startswith("/"),
            field=".path",
        ),
        Rule(
            (at,),
            f"!has(self.path) || !self.path.matches('{UNCLEAN_PATH}')",
            f"spec.{kind}.path must be a clean path: no '..' or '.' parts, no '//', no trailing '/'",
            lambda s: not _has(s, "path") or not _search(UNCLEAN_PATH, s["path"]),
            field=".path",
        ),
        Rule(
            (at,),
            f"!has(self.volume) || !has(self.path) || !{_cel_list(KUBETUNE_MOUNTS)}.exists(m, "
            f"{_overlapping_cel('self.path', 'm')})",
            f"spec.{kind}.path must not mount a volume at, inside or above kubetune's own mounts "
            f"({', '.join(KUBETUNE_MOUNTS)}: checkpoints, trainer config, caches, temporary files)",
            lambda s: (
                not _has(s, "volume")
                or not _has(s, "path")
                or not any(overlapping(s["path"], m) for m in KUBETUNE_MOUNTS)
            ),
            field=".path",
        ),
        Rule(
            (f"{at}.volume",),
            f"!has(self.subPath) || (!self.subPath.startsWith('/') && !self.subPath.matches('{CLIMBS_OUT}'))",
            f"spec.{kind}.volume.subPath must be a relative path inside the claim: no leading '/', no '..'",
            lambda s: (
                not _has(s, "subPath")
                or (not s["subPath"].startswith("/") and not _search(CLIMBS_OUT, s["subPath"]))
            ),
            field=".subPath",
        ),
        Rule(
            (f"{at}.revision",),
            f"!self.matches('{BAD_GIT_REF}')",
            f"spec.{kind}.revision must be a Git branch, tag or commit: no '..', '@{{', '//', no leading or "
            "trailing '/', no part that starts with '.' or ends with '.lock', no trailing '.'",
            lambda s: not _search(BAD_GIT_REF, s),
        ),
    ]


def _dataset_rules() -> list[Rule]:
    """spec.dataset's own fields together (those that do nothing in some combination: :mod:`.rules_ignored`)."""
    return [
        Rule(
            ("spec.dataset",),
            "!(has(self.evalSplit) && has(self.evalFraction))",
            "spec.dataset needs at most one of evalSplit or evalFraction",
            lambda s: not (_has(s, "evalSplit") and _has(s, "evalFraction")),
            field=".evalFraction",
        ),
        Rule(
            ("spec.dataset",),
            "self.layout == 'native' || self.format == 'auto' || self.format == 'messages'",
            "spec.dataset.layout sharegpt and alpaca are converted into chat messages: spec.dataset.format "
            "must be messages (or auto)",
            lambda s: (
                s.get("layout", "native") == "native" or s.get("format", "auto") in ("auto", "messages")
            ),
            field=".format",
        ),
    ]


def _quantity_rule(place: str) -> Rule:
    return Rule(
        (place,),
        "isQuantity(self) && quantity(self).isGreaterThan(quantity('0'))",
        f"{place} must be a Kubernetes quantity above zero (e.g. 16, 500m, 64Gi)",
        positive_quantity,
    )


def _env_rules() -> list[Rule]:
    at = ("spec.env[]",)
    out = [
        Rule(
            at,
            "has(self.value) != has(self.valueFrom)",
            "each spec.env entry needs exactly one of value or valueFrom",
            lambda s: _has(s, "value") != _has(s, "valueFrom"),
        ),
        Rule(
            at,
            f"!has(self.value) || !self.name.matches('{SECRET_LIKE_ENV}')",
            "secrets must not be inline: use valueFrom.secretKeyRef for a variable whose name "
            "looks like a credential",
            lambda s: not _has(s, "value") or not _search(SECRET_LIKE_ENV, s["name"]),
            field=".value",
        ),
        Rule(
            at,
            f"!has(self.value) || !(self.value.matches('{URI_USERINFO}') || self.value.matches('{QUERY_CREDENTIAL}'))",
            "spec.env[].value must not carry credentials (a URL with user:password@ or a token in its "
            "query): put them in a Secret and use valueFrom.secretKeyRef",
            lambda s: (
                not _has(s, "value")
                or not (_search(URI_USERINFO, s["value"]) or _search(QUERY_CREDENTIAL, s["value"]))
            ),
            field=".value",
        ),
        # what spec.env may not set, declared once in kubetune_api.pod_env (RESERVED_ENV): one rule per class
        *(
            Rule(
                at,
                r.cel(),
                f"spec.env[].name must not be {r.what}: {r.why}",
                lambda s, r=r: not r.refuses(s["name"]),
                field=".name",
            )
            for r in RESERVED_ENV
        ),
    ]
    for name, (pattern, what) in TUNING_ENV.items():
        out.append(
            Rule(
                at,
                f"self.name != '{name}' || !has(self.value) || self.value == '' || self.value.matches('{pattern}')",
                f"{name} must be {what}",
                lambda s, name=name, pattern=pattern: (
                    s["name"] != name
                    or not _has(s, "value")
                    or s["value"] == ""
                    or _search(pattern, s["value"])
                ),
                field=".value",
            )
        )
    return out


def _scheduling_rules() -> list[Rule]:
    at = ("spec.resources.tolerations[]",)
    return [
        Rule(
            ("spec.resources.nodeSelector",),
            f"self.all(k, {_label_key_cel('k')})",
            "spec.resources.nodeSelector keys must be label keys: an optional DNS subdomain and '/', then "
            "1 to 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit",
            lambda s: all(label_key_ok(k) for k in s),
        ),
        Rule(
            at,
            f"!has(self.key) || self.key == '' || ({_label_key_cel('self.key')})",
            "spec.resources.tolerations[].key must be a label key (e.g. nvidia.com/gpu)",
            lambda s: not _has(s, "key") or s["key"] == "" or label_key_ok(s["key"]),
            field=".key",
        ),
        Rule(
            at,
            "(has(self.key) && self.key != '') || (has(self.operator) && self.operator == 'Exists')",
            "spec.resources.tolerations[].operator must be Exists when key is empty (it then tolerates every taint)",
            lambda s: (_has(s, "key") and s["key"] != "") or s.get("operator") == "Exists",
            field=".operator",
        ),
        Rule(
            at,
            "!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''",
            "spec.resources.tolerations[].value must be empty when operator is Exists",
            lambda s: s.get("operator") != "Exists" or s.get("value", "") == "",
            field=".value",
        ),
        Rule(
            at,
            "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
            "spec.resources.tolerations[].tolerationSeconds needs effect: NoExecute",
            lambda s: not _has(s, "tolerationSeconds") or s.get("effect") == "NoExecute",
            field=".tolerationSeconds",
        ),
    ]


def _spec_rules() -> list[Rule]:
    """Rules across spec's fields (self is spec, with the API server's defaults filled in)."""
    at = ("spec",)
    return [
        Rule(
            at,
            "!has(self.lora) || self.method == 'lora'",
            "spec.lora is only allowed with method: lora",
            lambda s: not _has(s, "lora") or s["method"] == "lora",
            field=".lora",
        ),
        Rule(
            at,
            "self.resources.nodes == 1 || self.resources.gpusPerNode > 0",
            "spec.resources.nodes > 1 needs spec.resources.gpusPerNode > 0",
            lambda s: s["resources"]["nodes"] == 1 or s["resources"]["gpusPerNode"] > 0,
            field=".resources.nodes",
        ),
        Rule(
            at,
            "self.resources.nodes == 1 || has(self.storage.existingClaim) || "
            "self.storage.accessMode == 'ReadWriteMany'",
            "multi-node training needs a shared checkpoint volume: set storage.accessMode: ReadWriteMany "
            "or storage.existingClaim",
            lambda s: (
                s["resources"]["nodes"] == 1
                or _has(s["storage"], "existingClaim")
                or s["storage"]["accessMode"] == "ReadWriteMany"
            ),
            field=".storage.accessMode",
        ),
        Rule(
            at,
            "!has(self.resources.gpuProduct) || self.resources.gpusPerNode > 0",
            "spec.resources.gpuProduct needs spec.resources.gpusPerNode > 0",
            lambda s: not _has(s["resources"], "gpuProduct") or s["resources"]["gpusPerNode"] > 0,
            field=".resources.gpuProduct",
        ),
        Rule(
            at,
            "!has(self.training.tokensPerStep) || self.training.packing",
            "spec.training.tokensPerStep needs spec.training.packing: true",
            lambda s: not _has(s["training"], "tokensPerStep") or s["training"]["packing"],
            field=".training.tokensPerStep",
        ),
        Rule(
            at,
            "!has(self.training.evalSteps) || has(self.dataset.evalSplit) || has(self.dataset.evalFraction)",
            "spec.training.evalSteps needs evaluation data: set spec.dataset.evalSplit or spec.dataset.evalFraction",
            lambda s: (
                not _has(s["training"], "evalSteps")
                or _has(s["dataset"], "evalSplit")
                or _has(s["dataset"], "evalFraction")
            ),
            field=".training.evalSteps",
        ),
        Rule(
            at,
            "!self.training.assistantOnlyLoss || self.dataset.format != 'text'",
            "spec.training.assistantOnlyLoss needs chat data (dataset.format messages or auto)",
            lambda s: not s["training"]["assistantOnlyLoss"] or s["dataset"]["format"] != "text",
            field=".training.assistantOnlyLoss",
        ),
        Rule(
            at,
            "!has(self.model.volume) || !has(self.dataset.volume) || !has(self.model.path) || "
            f"!has(self.dataset.path) || !{_overlapping_cel('self.model.path', 'self.dataset.path')}",
            "spec.dataset.path and spec.model.path are both volume mounts: they must not be the same path "
            "or one inside the other",
            lambda s: (
                not _has(s["model"], "volume")
                or not _has(s["dataset"], "volume")
                or not _has(s["model"], "path")
                or not _has(s["dataset"], "path")
                or not overlapping(s["model"]["path"], s["dataset"]["path"])
            ),
            field=".dataset.path",
        ),
    ]


def _nf4(spec: dict[str, Any]) -> bool:
    return (spec.get("lora") or {}).get("quantization") == "nf4"


def _lora_rules() -> list[Rule]:
    """spec.lora: the target-module preset alone, and QLoRA only where it can run (preparation refuses
    the GPUs it cannot run on by their product, before any is held: QuantizationNotSupported)."""
    return [
        Rule(
            ("spec.lora",),
            f"!self.targetModules.exists(m, m == '{ALL_LINEAR}') || size(self.targetModules) == 1",
            f"spec.lora.targetModules holds the preset '{ALL_LINEAR}' (every linear layer but the output "
            "head) only alone: list it alone, or name the modules",
            lambda s: ALL_LINEAR not in s.get("targetModules", []) or len(s["targetModules"]) == 1,
            field=".targetModules",
        ),
        Rule(
            ("spec",),
            f"!({_NF4_CEL}) || self.resources.gpusPerNode > 0",
            "spec.lora.quantization nf4 (QLoRA) needs a GPU: bitsandbytes' 4-bit layers do not train on a "
            "CPU; set spec.resources.gpusPerNode above 0, or quantization: none",
            lambda s: not _nf4(s) or s["resources"]["gpusPerNode"] > 0,
            field=".lora.quantization",
        ),
        Rule(
            ("spec",),
            f"!({_NF4_CEL}) || self.training.precision == 'bf16'",
            "spec.lora.quantization nf4 (QLoRA) computes in bf16: spec.training.precision must be bf16",
            lambda s: not _nf4(s) or s["training"]["precision"] == "bf16",
            field=".training.precision",
        ),
    ]


_PREFERS_CEL = "self.objective != 'sft'"
_PAIRS = "spec.objective dpo and orpo train on preference pairs (the data's prompt, chosen and rejected)"


def _prefers(spec: dict[str, Any]) -> bool:
    return spec.get("objective", "sft") != "sft"


def _preference_rules() -> list[Rule]:
    """spec.objective dpo and orpo: preference pairs as they are named, and no SFT-only setting that
    would do nothing for them (packing, a default, is documented as SFT's instead)."""
    data = [
        (
            "format",
            "self.dataset.format == 'auto'",
            "spec.dataset.format must be auto (pairs are found by their columns)",
            lambda d: d.get("format", "auto") == "auto",
        ),
        (
            "layout",
            "self.dataset.layout == 'native'",
            "spec.dataset.layout must be native (sharegpt and alpaca are SFT conversations)",
            lambda d: d.get("layout", "native") == "native",
        ),
        (
            "columns",
            "!has(self.dataset.columns)",
            "spec.dataset.columns is not used: the columns are prompt, chosen and rejected as named",
            lambda d: not _has(d, "columns"),
        ),
        (
            "roles",
            "!has(self.dataset.roles)",
            "spec.dataset.roles is not used: conversational pairs need "
            "the chat roles system, user, assistant or tool",
            lambda d: not _has(d, "roles"),
        ),
        (
            "systemPrompt",
            "!has(self.dataset.systemPrompt)",
            "spec.dataset.systemPrompt is not used: put a system turn in the prompt instead",
            lambda d: not _has(d, "systemPrompt"),
        ),
    ]
    return [
        Rule(
            ("spec",),
            f"!has(self.preference) || {_PREFERS_CEL}",
            "spec.preference is only used with objective dpo or orpo",
            lambda s: not _has(s, "preference") or _prefers(s),
            field=".preference",
        ),
        *(
            Rule(
                ("spec",),
                f"!({_PREFERS_CEL}) || {cel}",
                f"{_PAIRS}: {what}",
                lambda s, ok=ok: not _prefers(s) or ok(s["dataset"]),
                field=f".dataset.{name}",
            )
            for name, cel, what, ok in data
        ),
        Rule(
            ("spec",),
            f"!({_PREFERS_CEL}) || !self.training.assistantOnlyLoss",
            f"spec.training.assistantOnlyLoss is SFT's: {_PAIRS} and score the whole chosen and rejected "
            "answers",
            lambda s: not _prefers(s) or not s["training"]["assistantOnlyLoss"],
            field=".training.assistantOnlyLoss",
        ),
        Rule(
            ("spec",),
            f"!({_PREFERS_CEL}) || !has(self.training.tokensPerStep)",
            "spec.training.tokensPerStep is packing's, and preference pairs (objective dpo and orpo) are padded, "
            "never packed: set batchSize instead",
            lambda s: not _prefers(s) or not _has(s["training"], "tokensPerStep"),
            field=".training.tokensPerStep",
        ),
    ]


def _unchanged_cel(steps: tuple[tuple[str, bool], ...], under: str = "") -> str:
    """CEL: the field at ``steps`` (wire names below spec, each with whether it is required) is the
    same in ``self`` and ``oldSelf``. A transition rule on the field itself would run only when both
    exist, so the rule sits on spec and each optional step checks presence first (adding or removing
    the field is a change too)."""
    (wire, required), rest = steps[0], steps[1:]
    new, old = f"self.{under}{wire}", f"oldSelf.{under}{wire}"
    same = _unchanged_cel(rest, f"{under}{wire}.") if rest else f"{new} == {old}"
    if required:
        return same
    return f"has({new}) == has({old}) && (!has({new}) || {f'({same})' if rest else same})"


def _unchanged(new: Any, old: Any, keys: tuple[str, ...]) -> bool:
    """The Python twin of :func:`_unchanged_cel` on the wire form of two specs."""
    for key in keys:
        if _has(new, key) != _has(old, key):
            return False
        if not _has(new, key):
            return True
        new, old = new[key], old[key]
    return bool(new == old)


def immutable_rules(parts: Iterable[tuple[tuple[tuple[str, bool], ...], tuple[str, ...]]]) -> list[Rule]:
    """Transition rules (oldSelf): what may not change once created, one rule per part.

    ``parts``: each part that may not change, as its path below spec (each step's wire name and
    whether it is required) and the paths beside it that may change (named in its message); the spec's
    model and its one list of mutable paths give them (:func:`kubetune_api.admission.immutable_parts`).
    """
    out = []
    for steps, beside in parts:
        path = ".".join(wire for wire, _ in steps)
        keys = tuple(wire for wire, _ in steps)
        message = f"spec.{path} is immutable once created"
        if beside:
            message += f" (only {' and '.join(beside)} may change)"
        out.append(
            Rule(
                ("spec",),
                _unchanged_cel(steps),
                message,
                lambda s, o, keys=keys: _unchanged(s, o, keys),
                field=f".{path}",
                old=True,
            )
        )
    return out


@functools.cache
def object_rules() -> tuple[Rule, ...]:
    """Every rule on one object, in the order the CRD lists them at each place; the transition rules
    (:func:`immutable_rules`) follow them in :func:`kubetune_api.admission.all_rules`."""

    root = [
        Rule(
            ("",),
            f"size(self.metadata.name) <= {MAX_NAME_LENGTH}",
            f"metadata.name must be at most {MAX_NAME_LENGTH} characters "
            "(kubetune adds suffixes such as -train-worker-0 to child objects)",
            lambda s: len(s["metadata"]["name"]) <= MAX_NAME_LENGTH,
            reason="FieldValueInvalid",
        ),
        Rule(
            ("",),
            f"self.metadata.name.matches('{NAME_PATTERN}')",
            "metadata.name must be a DNS-1035 label (lowercase letters, digits and '-', "
            "starting with a letter): PyTorchJob Services are named after it",
            lambda s: _search(NAME_PATTERN, s["metadata"]["name"]),
            reason="FieldValueInvalid",
        ),
    ]
    return (
        *root,
        *_source_rules("model"),
        *_source_rules("dataset"),
        *_dataset_rules(),
        Rule(
            ("spec.training",),
            "has(self.epochs) != has(self.maxSteps)",
            "set exactly one of training.epochs or training.maxSteps",
            lambda s: _has(s, "epochs") != _has(s, "maxSteps"),
        ),
        Rule(
            ("spec.training",),
            "!(has(self.warmupSteps) && has(self.warmupRatio))",
            "set at most one of training.warmupSteps or training.warmupRatio",
            lambda s: not (_has(s, "warmupSteps") and _has(s, "warmupRatio")),
            field=".warmupRatio",
        ),
        *(
            _quantity_rule(p)
            for p in ("spec.resources.cpu", "spec.resources.memory", "spec.resources.sharedMemory")
        ),
        *_scheduling_rules(),
        _quantity_rule("spec.storage.size"),
        Rule(
            ("spec.storage",),
            "!has(self.existingClaim) || !has(self.storageClassName)",
            "storage.storageClassName is only used when kubetune creates the claim (no existingClaim)",
            lambda s: not (_has(s, "existingClaim") and _has(s, "storageClassName")),
            field=".storageClassName",
        ),
        Rule(
            ("spec.budget",),
            "has(self.maxDuration) || has(self.maxGpuHours)",
            "spec.budget needs maxDuration or maxGpuHours (or no budget at all)",
            lambda s: _has(s, "maxDuration") or _has(s, "maxGpuHours"),
        ),
        Rule(
            ("spec.budget",),
            "!has(self.maxDuration) || self.maxDuration.matches('[1-9]')",
            "spec.budget.maxDuration must be above zero (e.g. 90m, 2h30m, 45s)",
            lambda s: not _has(s, "maxDuration") or _search("[1-9]", s["maxDuration"]),
            field=".maxDuration",
        ),
        *registration_rules(),
        *name_rules(),
        *_env_rules(),
        *credential_shape_rules(),
        *_spec_rules(),
        *_lora_rules(),
        *_preference_rules(),
        *lineage_rules(),
        *ignored_rules(),
    )


# Where a value may hold a credential by its shape (cel.CREDENTIAL_SHAPES): every env value, and every
# URI or reference field (the hub ids, revisions, the registered model, MLflow's names, the image)
CREDENTIAL_SHAPE_FIELDS = (
    ("spec.env[]", "value"),
    ("spec.model", "name"),
    ("spec.model", "revision"),
    ("spec.model", "registered"),
    ("spec.dataset", "name"),
    ("spec.dataset", "revision"),
    ("spec.registration", "trackingUri"),
    ("spec.registration", "registryUri"),
    ("spec.registration", "experiment"),
    ("spec.registration", "modelName"),
    ("spec", "image"),
)


def credential_shape_rules() -> list[Rule]:
    """One rule per field of :data:`CREDENTIAL_SHAPE_FIELDS`: its value does not look like a
    credential of a known format (the message names the field and the kinds, never the value)."""
    out = []
    for place, name in CREDENTIAL_SHAPE_FIELDS:
        where = f"{place}.{name}"
        secret = "use valueFrom.secretKeyRef" if place == "spec.env[]" else "reference it from spec.secrets"
        # up to 64 env values of 4096 characters: one rule per shape keeps each within the API
        # server's estimated cost budget for a rule
        shapes = CREDENTIAL_SHAPES if place == "spec.env[]" else (("", CREDENTIAL_SHAPE),)
        for kind, pattern in shapes:
            out.append(
                Rule(
                    (place,),
                    f"!has(self.{name}) || !self.{name}.matches('{pattern}')",
                    f"{where} looks like it holds a credential (a token or signed URL: "
                    f"{kind or CREDENTIAL_SHAPE_KINDS}): put it in a Secret and {secret}",
                    lambda s, name=name, pattern=pattern: not _has(s, name) or not _search(pattern, s[name]),
                    field=f".{name}",
                )
            )
    return out


def rules_at(place: str) -> list[Rule]:
    return [r for r in object_rules() if place in r.places]


# --- the Python enforcer ----------------------------------------------------------------------------


def instances(obj: Any, place: str, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """The values at ``place`` in ``obj`` and their paths as the API server writes them
    (``spec.env[2]``). An absent optional field has no instance (its rules do not run)."""
    if not place:
        yield prefix, obj
        return
    head, _, rest = place.partition(".")
    is_list = head.endswith("[]")
    key = head.removesuffix("[]")
    if not isinstance(obj, dict) or key not in obj:
        return
    value = obj[key]
    path = f"{prefix}.{key}" if prefix else key
    if is_list:
        for i, item in enumerate(value if isinstance(value, list) else []):
            yield from instances(item, rest, f"{path}[{i}]")
    else:
        yield from instances(value, rest, path)


def _where(path: str, field: str | None) -> str:
    return f"{path}{field or ''}"


def check(
    obj: dict[str, Any], schema: dict[str, Any], *, under: str = "", only_root: bool = False
) -> list[str]:
    """The rules ``obj`` (the wire form, defaults filled in) breaks: one ``path: message`` each.

    ``schema``: the structural schema of ``obj`` (:func:`kubetune_api.schema.structural`), whose list
    types are checked too. ``under``: the place of ``obj`` itself (``"spec"`` when ``obj`` is a spec);
    only the rules at or below it run, with paths written from the root as the API server writes
    them. ``only_root``: only the rules on the whole object (``obj`` is the FineTuneJob; no list type
    there, ``schema`` is not read). :func:`kubetune_api.admission.check` checks a whole manifest.
    """
    problems: list[str] = []
    for rule in object_rules():
        if rule.old:
            continue
        for place in rule.places:
            if only_root and place:
                continue
            if under and not (
                place == under or place.startswith(under + ".") or place.startswith(under + "[")
            ):
                continue
            rel = place[len(under) :].lstrip(".") if under else place
            for path, value in instances(obj, rel, under):
                if not rule.check(value):
                    where = _where(path, rule.field)
                    problems.append(f"{where}: {rule.message}" if where else rule.message)
    if not only_root:
        problems += list_type_problems(obj, schema, under)
    return problems


class RuleError(ValueError):
    """A FineTuneJob the API server would refuse; ``problems`` has one ``path: message`` line each,
    and the error's text one line each, after ``source`` (the manifest's file) when given."""

    def __init__(self, problems: list[str], source: str | None = None) -> None:
        self.problems = problems
        super().__init__("\n".join(f"{source}: {p}" if source else p for p in problems))
