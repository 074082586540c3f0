"""Which model names and experiments a namespace's jobs may use in the model registry (MLflow).

One operator serves many teams, and MLflow's names are global: without a rule, a job in namespace
``team-a`` could register a version of ``team-b``'s model (and move its alias), or start from
``team-b``'s registered model. The platform chooses (Helm values ``registry.tenancy`` and
``registry.modelNames``, the operator's ``KUBETUNE_REGISTRY_TENANCY`` and
``KUBETUNE_REGISTRY_MODEL_NAMES``):

- ``namespace-prefix`` (the chart's default): a namespace's model names start with ``<namespace>.``
  (a dot: namespaces are DNS labels and hold none, so ``team.x`` can never be ``team-a``'s; with a
  ``-`` namespace ``team`` would own ``team-a-model``), and its experiments are ``kubetune/<namespace>``
  (the default) or below it; a namespace may be granted more, as glob patterns
  (``{"team-a": ["shared-*"]}``).
- ``off``: one team, or names agreed elsewhere; nothing is checked.

The names checked are those a job registers to (``registration.modelName``, or its default, the
job's name), the experiment it logs to (``registration.experiment``, set), and the registered model
it starts from (``model.registered``). CEL cannot check this at admission: the rule depends on the
operator's settings, not on the object, and a CRD's rules see only ``metadata.name`` and
``generateName`` of its metadata, not its namespace. The operator checks it (:func:`refusal`) on
every pass until the job's training object exists (read from the API server: the status alone,
which a shared trainer ServiceAccount may write, is no proof that a job started), so before creating
anything, and again before it creates the registration Job or moves an alias
(:mod:`kubetune_operator.state`): a job that started before tenancy was on registers nothing outside
its names.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from fnmatch import fnmatchcase

from .spec import FineTuneJob

MODES = ("namespace-prefix", "off")
REASON = "ModelNameNotAllowed"
SEPARATOR = "."


def parse_mode(value: str | None) -> str:
    """The tenancy mode from its setting (unset: ``off``, an operator run without the chart).

    >>> parse_mode(None), parse_mode("namespace-prefix")
    ('off', 'namespace-prefix')
    """
    if value is None:
        return "off"
    if value not in MODES:
        raise ValueError(f"registry tenancy {value!r}: expected one of {', '.join(MODES)}")
    return value


def parse_grants(value: str | None) -> dict[str, tuple[str, ...]]:
    """The names granted beyond the prefix, per namespace: a JSON object of lists of glob patterns.

    >>> parse_grants('{"team-a": ["shared-*"]}')
    {'team-a': ('shared-*',)}
    """
    if not value:
        return {}
    raw = json.loads(value)
    if not isinstance(raw, dict) or not all(
        isinstance(v, list) and all(isinstance(p, str) and p for p in v) for v in raw.values()
    ):
        raise ValueError("registry model names: expected a JSON object of namespace -> list of glob patterns")
    return {str(k): tuple(v) for k, v in raw.items()}


def model_name_allowed(name: str, namespace: str, grants: Sequence[str] = ()) -> bool:
    """Whether ``namespace`` may use the registered model ``name``.

    >>> [model_name_allowed(n, "team-a") for n in ("team-a.qwen", "team-a-qwen", "team.qwen", "qwen")]
    [True, False, False, False]
    >>> model_name_allowed("shared-base", "team-a", ("shared-*",))
    True
    """
    return name.startswith(namespace + SEPARATOR) or any(fnmatchcase(name, p) for p in grants)


def experiment_allowed(experiment: str, namespace: str, grants: Sequence[str] = ()) -> bool:
    """Whether ``namespace`` may log to ``experiment``: its own default, below it, or granted.

    >>> [experiment_allowed(e, "team-a") for e in ("kubetune/team-a", "kubetune/team-a/x", "kubetune/team-ab")]
    [True, True, False]
    """
    own = f"kubetune/{namespace}"
    return (
        experiment in (own,)
        or experiment.startswith(own + "/")
        or any(fnmatchcase(experiment, p) for p in grants)
    )


def _registered_name(uri: str) -> str:
    """The model name of ``models:/<name>@<alias>`` or ``models:/<name>/<version>``."""
    return re.split(r"[@/]", uri.removeprefix("models:/"), maxsplit=1)[0]


def refusal(job: FineTuneJob, mode: str, grants: Mapping[str, Sequence[str]]) -> str | None:
    """Why ``job`` may not use the registry names it names (the field, the name, the rule), or None.

    A job's names are the platform's to give, not the job author's: the message says which field,
    which name, and what its namespace may use.
    """
    if mode == "off":
        return None
    ns = job.metadata.namespace
    granted = tuple(grants.get(ns, ()))
    also = f" or matching {', '.join(granted)}" if granted else ""
    reg = job.spec.registration
    names: list[str] = []
    experiments: list[str] = []
    name = reg.model_name or job.metadata.name
    if not model_name_allowed(name, ns, granted):
        field = (
            "spec.registration.modelName"
            if reg.model_name
            else "spec.registration.modelName (unset: the job's name)"
        )
        names.append(f"{field} {name!r} is outside its namespace's names")
    registered = job.spec.model.registered
    if registered and not model_name_allowed(_registered_name(registered), ns, granted):
        names.append(
            f"spec.model.registered {_registered_name(registered)!r} is outside its namespace's names"
        )
    if reg.experiment and not experiment_allowed(reg.experiment, ns, granted):
        experiments.append(
            f"spec.registration.experiment {reg.experiment!r} is outside its namespace's experiments"
        )
    # each refused field with the rule of its kind: an experiment problem talks about experiments
    rules = []
    if names:
        rules.append(f"namespace {ns} may use model names starting with '{ns}{SEPARATOR}'{also}")
    if experiments:
        rules.append(f"namespace {ns} may use experiments kubetune/{ns} or below it{also}")
    if not rules:
        return None
    return "; ".join(names + experiments) + f" (registry tenancy {mode}: {'; '.join(rules)})"
