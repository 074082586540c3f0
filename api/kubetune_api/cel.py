"""A rule's two enforcers, and what they share: the :class:`Rule` type (a CEL expression the API
server evaluates, and its Python twin), the patterns both sides match with (RE2 and Python's ``re``
agree on them), and the helpers that write each check twice.

The rules themselves are declared in :mod:`kubetune_api.rules` and :mod:`kubetune_api.rules_lineage`;
this module sits below both (and below :mod:`kubetune_api.spec`), so that none of them imports another
in a circle.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Rule:
    """One CEL rule and its Python twin.

    ``places``: where the rule sits, as wire paths from the object's root (``spec.training``;
    ``spec.env[]`` for each item of a list; ``""`` for the root). ``field``: the CEL ``fieldPath``,
    relative to the place (the field the message is about). ``check``: the Python twin, True when the
    value at the place passes; for a transition rule (``old``) it takes the new and the old value.
    """

    places: tuple[str, ...]
    cel: str
    message: str
    check: Callable[..., bool]
    field: str | None = None
    reason: str | None = None
    old: bool = False

    def validation(self) -> dict[str, str]:
        """The rule as one ``x-kubernetes-validations`` entry."""
        out = {"rule": self.cel, "message": self.message}
        if self.field:
            out["fieldPath"] = self.field
        if self.reason:
            out["reason"] = self.reason
        return out


# --- names and patterns the spec's fields declare and the rules check -------------------------------

# The longest child name suffix is the PyTorchJob worker Service "<job>-train-worker-<i>"; Services
# are DNS-1035 labels (<= 63 characters, starting with a letter). 40 leaves room for 999 workers.
MAX_NAME_LENGTH = 40
NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
# Environment variable names that look like they carry a secret must come from a Secret.
SECRET_LIKE_ENV = r"(?i).*(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_?KEY|CREDENTIAL).*"  # noqa: S105 (a pattern, not a secret)
# MLflow keeps these alias names for itself: "latest" (any case) and v<number> name versions
RESERVED_ALIAS_MESSAGE = (
    "spec.registration.alias must not be 'latest' or v<number>: MLflow reserves them for versions"
)

# --- patterns shared by CEL and Python (RE2 and Python's re agree on them) ---------------------------

# Kubernetes label keys: an optional DNS-subdomain prefix (at most 253 characters) and '/', then a name
# of 1 to 63 characters. The prefix's length is checked apart (indexOf).
LABEL_KEY = (
    "^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    "[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
# A path with '..' or '.' as a part, '//', or a trailing '/': not one clean absolute path
UNCLEAN_PATH = "//|(^|/)[.][.]?(/|$)|[^/]/$"
CLIMBS_OUT = "(^|/)[.][.](/|$)"
# What git check-ref-format refuses beyond single characters (those are the field's pattern)
BAD_GIT_REF = "[.][.]|@[{]|//|^/|/$|[.]$|(^|/)[.]|[.]lock(/|$)|^@$"
# user:password@ (or a token@) in a URL
URI_USERINFO = "[A-Za-z][A-Za-z0-9+.-]*://[^/?#@ ]+@"
URI_CREDENTIALS = "^[A-Za-z][A-Za-z0-9+.-]*://[^/?#@]*@"
# a query parameter whose name says it carries a credential (?token=..., &api_key=...)
QUERY_CREDENTIAL = (
    "[?&][^=&#]*(?i:token|secret|passw|pwd|api_?key|access_?key|credential|signature|auth)[^=&#]*="
)


def _search(pattern: str, value: str) -> bool:
    """CEL's ``matches()``: RE2, true when the pattern matches anywhere in the string."""
    return re.search(pattern, value) is not None


def label_key_ok(key: str) -> bool:
    """A Kubernetes label key (the Python twin of :func:`_label_key_cel`).

    >>> [label_key_ok(k) for k in ("nvidia.com/gpu.product", "zone", "-bad", "a/b/c", "x" * 64)]
    [True, True, False, False, False]
    """
    return _search(LABEL_KEY, key) and ("/" not in key or key.index("/") <= 253)


def _label_key_cel(var: str) -> str:
    return f"{var}.matches('{LABEL_KEY}') && (!{var}.contains('/') || {var}.indexOf('/') <= 253)"


def positive_quantity(value: str) -> bool:
    """The twin of ``isQuantity(self) && quantity(self).isGreaterThan(quantity('0'))`` for the values
    the field's pattern (spec.QUANTITY_PATTERN) lets through: a number and a positive multiplier.

    >>> [positive_quantity(v) for v in ("16Gi", "500m", "0.5", "0", "0Gi", "0e3", "0.000")]
    [True, True, True, False, False, False, False]
    """
    number = re.match(r"[0-9.]*", value)
    return number is not None and any(c in "123456789" for c in number.group())


def overlapping(a: str, b: str) -> bool:
    """Whether two clean absolute paths are the same, or one is inside the other."""
    return a == "/" or b == "/" or (a + "/").startswith(b + "/") or (b + "/").startswith(a + "/")


def _overlapping_cel(a: str, b: str) -> str:
    return f"({a} == '/' || {b} == '/' || ({a} + '/').startsWith({b} + '/') || ({b} + '/').startsWith({a} + '/'))"


def _cel_list(names: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{n}'" for n in names) + "]"


def _has(obj: Any, key: str) -> bool:
    return isinstance(obj, dict) and key in obj
