"""Nothing silently ignored: the rules that refuse a field where it would have no effect (see :mod:`.rules`).

A field that does nothing in some combination makes its author believe the job does what it does
not (a revision pinned on a file read from a volume, a seed that shuffles nothing). Each such
combination is refused where it is written, the message naming the field and what it needs. The
ones refused elsewhere, with the rules of their own kind: ``spec.lora`` without ``method: lora``,
``spec.training.tokensPerStep`` without packing, ``spec.training.evalSteps``, ``registration.gate``,
``registration.select: bestEval`` and ``resume: best`` without eval data, ``spec.model.revision``
without a Hub model, ``spec.model.volume``/``spec.dataset.volume`` without a path,
``storage.storageClassName`` with an existing claim, ``resources.gpuProduct`` on CPU.

Kept, documented on the field and told in an event instead (refusing would break a real use):
``spec.registration``'s other fields and ``spec.budget.register`` while ``registration.enabled`` is
false. ``enabled`` may change after creation, and they apply once it is turned on; the operator says
so: the job's ``Registered`` condition and ``Succeeded`` event name the ones set
(:mod:`kubetune_operator.state.machine`), and an alias changed while registration is off is held with
``AliasSynced`` False, ``RegistrationDisabled``, and a Warning event (:mod:`kubetune_operator.state.exits`).

A field with a default is refused only when it differs from its default: the API server fills the
default in before the rules run, so an explicit default cannot be told from none (and does nothing
either way).
"""

from __future__ import annotations

from typing import Final

from .cel import Rule, _has

# spec.dataset.seed's default (spec.DatasetSource): a different seed needs evalFraction
DEFAULT_DATASET_SEED = 42
# spec.storage's defaults (spec.StorageSpec): the new claim's; an existing claim keeps its own
DEFAULT_STORAGE_SIZE = "100Gi"
DEFAULT_ACCESS_MODE: Final = "ReadWriteOnce"
# spec.training.lossWatchdog's defaults (spec.LossWatchdog): (wire name, default)
WATCHDOG_DEFAULTS = (("spikeFactor", 3.0), ("patience", 3), ("window", 20))
_CLAIM = "is only used when kubetune creates the claim (no existingClaim)"


# spec.dataset.columns' fields each layout reads (spec.DatasetColumns): a field of another layout's is refused
LAYOUT_COLUMNS = {
    "native": ("messages", "role", "content", "prompt", "completion", "text"),
    "sharegpt": ("messages", "role", "content", "system"),
    "alpaca": ("instruction", "input", "output", "system"),
}
ALL_COLUMNS = tuple(dict.fromkeys(c for cs in LAYOUT_COLUMNS.values() for c in cs))


def _layout_columns_rule(layout: str) -> Rule:
    others = tuple(c for c in ALL_COLUMNS if c not in LAYOUT_COLUMNS[layout])
    taken = LAYOUT_COLUMNS[layout]
    named = ", ".join(taken[:-1]) + " and " + taken[-1]
    return Rule(
        ("spec.dataset",),
        f"!has(self.columns) || self.layout != '{layout}' || !("
        + " || ".join(f"has(self.columns.{c})" for c in others)
        + ")",
        f"spec.dataset.columns with layout {layout} names only {named} (the others are another layout's)",
        lambda s: (
            not _has(s, "columns")
            or s.get("layout", "native") != layout
            or not any(_has(s["columns"], c) for c in others)
        ),
        field=".columns",
    )


def _layout_rules() -> list[Rule]:
    at = ("spec.dataset",)
    return [
        *(_layout_columns_rule(layout) for layout in LAYOUT_COLUMNS),
        Rule(
            at,
            "!has(self.roles) || self.layout != 'alpaca'",
            "spec.dataset.roles is not used with layout alpaca: its rows have no roles (the instruction is the "
            "user's turn, the output the assistant's)",
            lambda s: not _has(s, "roles") or s.get("layout", "native") != "alpaca",
            field=".roles",
        ),
        Rule(
            at,
            "!has(self.roles) || self.format != 'text'",
            "spec.dataset.roles is not used with format text: its rows have no turns",
            lambda s: not _has(s, "roles") or s.get("format", "auto") != "text",
            field=".roles",
        ),
        Rule(
            at,
            "!has(self.systemPrompt) || self.format == 'auto' || self.format == 'messages'",
            "spec.dataset.systemPrompt is put into chat conversations: it needs format messages (or auto)",
            lambda s: not _has(s, "systemPrompt") or s.get("format", "auto") in ("auto", "messages"),
            field=".systemPrompt",
        ),
    ]


def _dataset_rules() -> list[Rule]:
    at = ("spec.dataset",)
    return [
        *_layout_rules(),
        Rule(
            at,
            "!has(self.revision) || self.revision == 'main' || has(self.name)",
            "spec.dataset.revision is only used with name (a Hub data set): a file or folder on a volume "
            "has no revision",
            lambda s: not _has(s, "revision") or s["revision"] == "main" or _has(s, "name"),
            field=".revision",
        ),
        Rule(
            at,
            "!has(self.subset) || has(self.name)",
            "spec.dataset.subset is only used with name (a configuration of a Hub data set): put the "
            "subset's files in spec.dataset.path instead",
            lambda s: not _has(s, "subset") or _has(s, "name"),
            field=".subset",
        ),
        Rule(
            at,
            f"!has(self.seed) || self.seed == {DEFAULT_DATASET_SEED} || has(self.evalFraction)",
            "spec.dataset.seed is only used with evalFraction (it picks the rows held out for evaluation); "
            "the training's own seed is spec.training.seed",
            lambda s: s.get("seed", DEFAULT_DATASET_SEED) == DEFAULT_DATASET_SEED or _has(s, "evalFraction"),
            field=".seed",
        ),
    ]


def _storage_rules() -> list[Rule]:
    at = ("spec.storage",)
    return [
        Rule(
            at,
            f"!has(self.existingClaim) || !has(self.size) || self.size == '{DEFAULT_STORAGE_SIZE}'",
            f"spec.storage.size {_CLAIM}: an existing claim keeps its own size",
            lambda s: (
                not _has(s, "existingClaim") or s.get("size", DEFAULT_STORAGE_SIZE) == DEFAULT_STORAGE_SIZE
            ),
            field=".size",
        ),
        Rule(
            at,
            f"!has(self.existingClaim) || !has(self.accessMode) || self.accessMode == '{DEFAULT_ACCESS_MODE}'",
            f"spec.storage.accessMode {_CLAIM}: an existing claim keeps its own access modes",
            lambda s: (
                not _has(s, "existingClaim")
                or s.get("accessMode", DEFAULT_ACCESS_MODE) == DEFAULT_ACCESS_MODE
            ),
            field=".accessMode",
        ),
        Rule(
            at,
            "!has(self.existingClaim) || !has(self.keepOnDelete) || !self.keepOnDelete",
            f"spec.storage.keepOnDelete {_CLAIM}: kubetune never deletes an existing claim",
            lambda s: not _has(s, "existingClaim") or not s.get("keepOnDelete", False),
            field=".keepOnDelete",
        ),
    ]


def _training_rules() -> list[Rule]:
    watchdog_cel = " && ".join(f"(!has(self.{k}) || self.{k} == {d})" for k, d in WATCHDOG_DEFAULTS)
    return [
        Rule(
            ("spec.training",),
            "!has(self.lrScheduler) || self.lrScheduler != 'constant' || (!has(self.warmupSteps) && !has(self.warmupRatio))",
            "spec.training.warmupSteps and warmupRatio are not used with lrScheduler: constant (it has no "
            "warm-up): use constant_with_warmup",
            lambda s: (
                s.get("lrScheduler") != "constant" or not (_has(s, "warmupSteps") or _has(s, "warmupRatio"))
            ),
            field=".lrScheduler",
        ),
        Rule(
            ("spec.training.lossWatchdog",),
            f"!has(self.enabled) || self.enabled || ({watchdog_cel})",
            "spec.training.lossWatchdog.spikeFactor, patience and window are only used with enabled: true",
            lambda s: s.get("enabled", True) or all(s.get(k, d) == d for k, d in WATCHDOG_DEFAULTS),
            field=".enabled",
        ),
    ]


def ignored_rules() -> list[Rule]:
    return [
        *_dataset_rules(),
        *_storage_rules(),
        *_training_rules(),
        Rule(
            ("spec",),
            "self.method == 'lora' || !has(self.registration) || !has(self.registration.mergeLora) "
            "|| self.registration.mergeLora",
            "spec.registration.mergeLora is only used with method: lora (a full fine-tune has no adapter to merge)",
            lambda s: s.get("method") == "lora" or (s.get("registration") or {}).get("mergeLora", True),
            field=".registration.mergeLora",
        ),
    ]
