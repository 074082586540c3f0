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
# Credentials by the shape of the value, whatever a field or variable is called: the one list (what, a
# pattern), joined into CREDENTIAL_SHAPE; rules.credential_shape_rules puts it on every env value and
# every URI or reference field. A token starts a word (not "task-..." for sk-). The messages name the
# kinds, never the value. (A URL's user:password@ and a query parameter named like a credential are
# URI_USERINFO, URI_CREDENTIALS and QUERY_CREDENTIAL, on the fields that hold URLs.)
_WORD = "(^|[^A-Za-z0-9_])"
CREDENTIAL_SHAPES = (
    ("hf_", _WORD + "hf_[A-Za-z0-9]{30,}"),  # Hugging Face
    ("ghp_/github_pat_", _WORD + "(gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})"),  # GitHub
    ("sk-", _WORD + "sk-[A-Za-z0-9_-]{20,}"),  # OpenAI-style API keys
    ("AKIA/ASIA", _WORD + "(AKIA|ASIA)[0-9A-Z]{16}([^0-9A-Za-z]|$)"),  # AWS access key ids
    ("xox?-", _WORD + "xox[abposr]-[0-9A-Za-z-]{10,}"),  # Slack
    ("ya29.", _WORD + "ya29[.][0-9A-Za-z_-]{20,}"),  # Google OAuth access tokens
    ("a JWT", _WORD + "eyJ[A-Za-z0-9_-]{8,}[.]eyJ[A-Za-z0-9_-]{8,}"),
    ("sig=", "[?&]sig=[^&#]"),  # Azure SAS
    ("X-Amz-Signature", "(?i:[?&]x-amz-(signature|credential|security-token)=)"),  # S3 presigned URLs
    ("X-Goog-Signature", "(?i:[?&]x-goog-(signature|credential)=)"),  # GCS signed URLs
)
CREDENTIAL_SHAPE = "|".join(f"({pattern})" for _, pattern in CREDENTIAL_SHAPES)
CREDENTIAL_SHAPE_KINDS = ", ".join(what for what, _ in CREDENTIAL_SHAPES)


# --- names that reach MLflow (and people): what each engine writes from one table ---------------------
#
# Code points no name may hold: C0 and C1 controls and DEL, the zero-width space, joiners and the
# left-to-right/right-to-left marks (U+200B-U+200F), the bidirectional embeddings and overrides
# (U+202A-U+202E) and isolates (U+2066-U+2069), the byte-order mark (U+FEFF): drawn as nothing, or
# reordering what is drawn, they make two names that read alike name two models. And the spaces a
# name may not start or end with (MLflow refuses a blank name; "assistant " is not "assistant").
UNSEEN_RANGES = (
    (0x00, 0x1F),
    (0x7F, 0x9F),
    (0xAD, 0xAD),  # soft hyphen
    (0x061C, 0x061C),  # Arabic letter mark
    (0x115F, 0x1160),  # Hangul fillers
    (0x180E, 0x180E),  # Mongolian vowel separator
    (0x200B, 0x200F),
    (0x202A, 0x202E),
    (0x2060, 0x2064),  # word joiner, invisible operators
    (0x2066, 0x2069),
    (0x3164, 0x3164),  # Hangul filler
    (0xFE00, 0xFE0F),  # variation selectors
    (0xFEFF, 0xFEFF),
    (0xFFA0, 0xFFA0),  # halfwidth Hangul filler
    (0xE0000, 0xE007F),  # tags
)
SPACE_RANGES = (
    (0x20, 0x20),
    (0xA0, 0xA0),
    (0x1680, 0x1680),
    (0x2000, 0x200A),
    (0x2028, 0x2029),
    (0x202F, 0x202F),
    (0x205F, 0x205F),
    (0x3000, 0x3000),
)
UNSEEN_MESSAGE = "control, zero-width, filler or bidirectional characters ({})".format(
    ", ".join(f"U+{a:04X}" if a == b else f"U+{a:04X}-U+{b:04X}" for a, b in UNSEEN_RANGES)
)


@dataclass(frozen=True)
class Pattern:
    """A regular expression in both engines' spellings, from one declaration: RE2's (``\\x{200B}``,
    in a raw CEL string ``r'...'``) and Python's (``\\U0000200B``). ``{unseen}`` and ``{space}`` in
    ``template`` stand for the character classes of :data:`UNSEEN_RANGES` and :data:`SPACE_RANGES`;
    the rest of it is written the same in both (ASCII, escapes of two hex digits)."""

    template: str

    @staticmethod
    def _class(ranges: tuple[tuple[int, int], ...], escape: Callable[[int], str]) -> str:
        return "[" + "".join(escape(a) if a == b else f"{escape(a)}-{escape(b)}" for a, b in ranges) + "]"

    def _spelled(self, escape: Callable[[int], str]) -> str:
        return self.template.format(
            unseen=self._class(UNSEEN_RANGES, escape), space=self._class(SPACE_RANGES, escape)
        )

    @property
    def re2(self) -> str:
        return self._spelled(lambda c: f"\\x{{{c:04X}}}")

    @property
    def python(self) -> str:
        return self._spelled(lambda c: f"\\U{c:08X}")

    def cel_matches(self, var: str) -> str:
        """``var.matches(r'...')``: a raw CEL string, so RE2 reads the backslashes."""
        return f"{var}.matches(r'{self.re2}')"

    def search(self, value: str) -> bool:
        return re2_search(self.python, value)


UNSEEN = Pattern("{unseen}")
EDGE_SPACE = Pattern("^{space}|{space}$")
# MLflow's model names: no '/' or ':' (the field's pattern), and not a path that resolves to another
# name (mlflow.utils.validation.path_not_unique: '.', a leading '..'); kubetune refuses '..' anywhere
# and '\\' (a separator on Windows) too.
PATH_LIKE_NAME = Pattern("[\\x5C]|[.][.]|^[.]$")
# An experiment may be a workspace path (/Users/me/x): '/' is fine, a '.' or '..' part or '\\' is not
EXPERIMENT_PATH_LIKE = Pattern("[\\x5C]|//|(^|/)[.][.]?(/|$)")
# models:/<name>@<alias> or models:/<name>/<version> (spec.REGISTERED_MODEL_PATTERN): the name, as
# PATH_LIKE_NAME and EDGE_SPACE say, and the alias, not one MLflow reserves
REGISTERED_PATH_LIKE = Pattern("^models:/([.][@/]|[^@/]*([.][.]|[\\x5C]))")
REGISTERED_EDGE_SPACE = Pattern("^models:/{space}|{space}[@/]")
REGISTERED_RESERVED_ALIAS = Pattern("@([lL][aA][tT][eE][sS][tT]|[vV][0-9]+)$")


# Case folding (``(?i)``): the API server's regexp (Go's, RE2 syntax) folds by Unicode's simple case
# folding orbits, K with the Kelvin sign and s with the long s as Python does, but not the Turkish
# dotless i (U+0131) and dotted I (U+0130), which Python's re folds to i and I. Python's twins read those two as a
# character that folds to nothing (and is in no class of ours), so both engines say the same.
# (re.ASCII would be wrong the other way: it would stop folding the Kelvin sign and the long s.)
_GO_UNFOLDED = str.maketrans({"\u0130": "\ufffd", "\u0131": "\ufffd"})


def re2_search(pattern: str, value: str) -> bool:
    """``re.search`` as CEL's ``matches()`` (Go's regexp) decides it, case folding included."""
    return re.search(pattern, value.translate(_GO_UNFOLDED)) is not None


def _search(pattern: str, value: str) -> bool:
    """CEL's ``matches()``: RE2, true when the pattern matches anywhere in the string."""
    return re2_search(pattern, value)


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
    """CEL's ``has()``: a key set to null is absent (the API server prunes nulls before the rules run)."""
    return isinstance(obj, dict) and obj.get(key) is not None
