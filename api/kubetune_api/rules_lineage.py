"""Rules of registration, the checkpoint catalog, the evaluation gate and chained jobs (see :mod:`.rules`).

Kept apart from :mod:`.rules` only for size; :func:`.rules.object_rules` lists them with the rest.
"""

from __future__ import annotations

from typing import Any

from .cel import (
    EDGE_SPACE,
    EXPERIMENT_PATH_LIKE,
    PATH_LIKE_NAME,
    QUERY_CREDENTIAL,
    REGISTERED_EDGE_SPACE,
    REGISTERED_PATH_LIKE,
    REGISTERED_RESERVED_ALIAS,
    RESERVED_ALIAS_MESSAGE,
    UNSEEN,
    UNSEEN_MESSAGE,
    URI_CREDENTIALS,
    Pattern,
    Rule,
    _has,
    _search,
)

# What the spec's eval data is: a named split, or a share held out of the training split.
_EVAL_CEL = "(has(self.dataset.evalSplit) || has(self.dataset.evalFraction))"
_SOURCES = ("name", "path", "fromJob", "registered")


def _has_eval(spec: dict[str, Any]) -> bool:
    dataset = spec.get("dataset") or {}
    return _has(dataset, "evalSplit") or _has(dataset, "evalFraction")


def _needs_eval(cel_condition: str, what: str, check: Any, field: str) -> Rule:
    return Rule(
        ("spec",),
        f"!({cel_condition}) || {_EVAL_CEL}",
        f"{what} needs eval data: set spec.dataset.evalSplit or spec.dataset.evalFraction",
        lambda s: not check(s) or _has_eval(s),
        field=field,
    )


def model_source_rule() -> Rule:
    """spec.model: exactly one place the starting weights come from."""
    cel = "[" + ", ".join(f"has(self.{k})" for k in _SOURCES) + "].exists_one(x, x)"
    return Rule(
        ("spec.model",),
        cel,
        "spec.model needs exactly one of name (a Hugging Face Hub id), path (a folder on a volume), "
        "fromJob (another FineTuneJob's model) or registered (models:/<name>@<alias> or /<version>)",
        lambda s: sum(_has(s, k) for k in _SOURCES) == 1,
    )


def _refused(place: str, field: str, pattern: Pattern, what: str) -> Rule:
    """``place.field``, when set, must not match ``pattern`` (both engines' spellings of it)."""
    var = f"self.{field}"
    return Rule(
        (place,),
        f"!has({var}) || !{pattern.cel_matches(var)}",
        f"{place}.{field} must not {what}",
        lambda s: not _has(s, field) or not pattern.search(s[field]),
        field=f".{field}",
    )


def name_rules() -> list[Rule]:
    """The names a job hands to MLflow, as strict as MLflow's own rules for them (and a little
    stricter where a name would read as another): the registered model's name, the experiment, and
    the registered model a job starts from (its name, and its alias, not one MLflow reserves)."""
    reg, model = "spec.registration", "spec.model"
    unseen, edge = f"hold {UNSEEN_MESSAGE}", "start or end with a space"
    return [
        _refused(reg, "modelName", UNSEEN, unseen),
        _refused(reg, "modelName", EDGE_SPACE, edge),
        _refused(
            reg,
            "modelName",
            PATH_LIKE_NAME,
            "be '.' or hold '..' or a backslash: MLflow refuses a model name that reads as a path",
        ),
        _refused(reg, "experiment", UNSEEN, unseen),
        _refused(reg, "experiment", EDGE_SPACE, edge),
        _refused(
            reg,
            "experiment",
            EXPERIMENT_PATH_LIKE,
            "have a '.' or '..' part, '//' or a backslash: an experiment path names one folder",
        ),
        _refused(model, "registered", UNSEEN, unseen),
        _refused(
            model, "registered", REGISTERED_EDGE_SPACE, "name a model whose name starts or ends with a space"
        ),
        _refused(
            model,
            "registered",
            REGISTERED_PATH_LIKE,
            "name a model that is '.' or holds '..' or a backslash: MLflow refuses such model names",
        ),
        _refused(
            model,
            "registered",
            REGISTERED_RESERVED_ALIAS,
            "use the alias 'latest' or v<number>: MLflow reserves them, no alias is ever set by those names",
        ),
    ]


def uri_credential_rules(at: tuple[str, ...], name: str) -> list[Rule]:
    """The rules of an MLflow URI field of spec.registration (trackingUri, registryUri): no credentials
    in its userinfo or its query; the credentials are the tracking server's Secrets."""
    field = f"spec.registration.{name}"
    return [
        Rule(
            at,
            f"!has(self.{name}) || !self.{name}.matches('{URI_CREDENTIALS}')",
            f"{field} must not carry credentials (user:password@): put them in a Secret "
            "and reference it from spec.secrets.mlflowTrackingUsername/mlflowTrackingPassword (or "
            "mlflowTrackingToken)",
            lambda s: not _has(s, name) or not _search(URI_CREDENTIALS, s[name]),
            field=f".{name}",
        ),
        Rule(
            at,
            f"!has(self.{name}) || !self.{name}.matches('{QUERY_CREDENTIAL}')",
            f"{field} must not carry credentials in its query (?token=...): put the "
            "token in a Secret and reference it from spec.secrets.mlflowTrackingToken",
            lambda s: not _has(s, name) or not _search(QUERY_CREDENTIAL, s[name]),
            field=f".{name}",
        ),
    ]


def registration_rules() -> list[Rule]:
    at = ("spec.registration",)
    return [
        Rule(
            at,
            "!has(self.alias) || (self.alias.lowerAscii() != 'latest' && !self.alias.matches('^[vV][0-9]+$'))",
            RESERVED_ALIAS_MESSAGE,
            lambda s: (
                not _has(s, "alias")
                or (s["alias"].lower() != "latest" and not _search("^[vV][0-9]+$", s["alias"]))
            ),
            field=".alias",
        ),
        *(uri_credential_rules(at, "trackingUri") + uri_credential_rules(at, "registryUri")),
    ]


def lineage_rules() -> list[Rule]:
    return [
        _needs_eval(
            "has(self.registration) && self.registration.select == 'bestEval'",
            "spec.registration.select: bestEval",
            lambda s: (s.get("registration") or {}).get("select") == "bestEval",
            ".registration.select",
        ),
        _needs_eval(
            "has(self.registration) && has(self.registration.gate)",
            "spec.registration.gate",
            lambda s: _has(s.get("registration"), "gate"),
            ".registration.gate",
        ),
        _needs_eval(
            "self.resume == 'best'", "spec.resume: best", lambda s: s.get("resume") == "best", ".resume"
        ),
        Rule(
            ("spec",),
            "!(self.resume == 'best' || (has(self.registration) && self.registration.select == 'bestEval')) "
            "|| !has(self.training.evalSteps) || self.training.saveSteps % self.training.evalSteps == 0 "
            "|| self.training.evalSteps % self.training.saveSteps == 0",
            "with resume: best or registration.select: bestEval, one of spec.training.saveSteps and evalSteps "
            "must be a multiple of the other: a checkpoint has an eval loss only when an evaluation ran at its step",
            lambda s: (
                not (s.get("resume") == "best" or (s.get("registration") or {}).get("select") == "bestEval")
                or not _has(s["training"], "evalSteps")
                or s["training"]["saveSteps"] % s["training"]["evalSteps"] == 0
                or s["training"]["evalSteps"] % s["training"]["saveSteps"] == 0
            ),
            field=".training.saveSteps",
        ),
        Rule(
            ("spec.registration.gate",),
            "has(self.maxEvalLoss) != has(self.minImprovement)",
            "spec.registration.gate needs exactly one of maxEvalLoss (an eval loss to reach) or minImprovement "
            "(a share below the base model's eval loss)",
            lambda s: _has(s, "maxEvalLoss") != _has(s, "minImprovement"),
        ),
        Rule(
            ("spec.model",),
            "!has(self.revision) || self.revision == 'main' || has(self.name)",
            "spec.model.revision is only used with name (a Hub model)",
            lambda s: not _has(s, "revision") or s["revision"] == "main" or _has(s, "name"),
            field=".revision",
        ),
        Rule(
            ("",),
            "!has(self.spec.model.fromJob) || self.spec.model.fromJob.name != self.metadata.name",
            "spec.model.fromJob.name must name another FineTuneJob: a job cannot start from its own model",
            lambda s: (s["spec"]["model"].get("fromJob") or {}).get("name") != s["metadata"]["name"],
            field=".spec.model.fromJob.name",
            reason="FieldValueInvalid",
        ),
    ]
