"""The phase, condition and reason names that readers of a FineTuneJob's status match on come from
the enums of :mod:`kubetune_api.status`, the operator's own: the Argo CD health check (Lua, which
cannot import them: checked here by reading it) and ``kubetune watch`` (which imports them)."""

from __future__ import annotations

import re

from tests.support.controlplane import REPO

from kubetune_api.status import ConditionType, Phase, Reason

LUA = REPO / "deploy" / "argocd" / "health" / "finetunejob.lua"
# Argo CD's own health statuses, and the condition statuses of Kubernetes: not kubetune's names
ARGOCD_HEALTH = {"Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown"}
CONDITION_STATUS = {"True", "False", "Unknown"}


def _code(lua: str) -> str:
    """The Lua without its comments (``--`` to the end of the line; the script has no ``--`` in strings)."""
    return "\n".join(line.split("--", 1)[0] for line in lua.splitlines())


def lua_names(lua: str) -> dict[str, set[str]]:
    code = _code(lua)
    return {
        "phases": set(re.findall(r'phase\s*==\s*"([^"]+)"', code)),
        # { ChildConflict = true, ... }: the sets of reasons the script looks a reason up in
        "reason_sets": set(re.findall(r"\b([A-Z][A-Za-z]+)\s*=\s*true\b", code)),
        "reasons": set(re.findall(r'reason(?:\([a-z]*\))?\s*==\s*"([^"]*)"', code)),
        "strings": set(re.findall(r'"([A-Z][A-Za-z]*)"', code)),
    }


def test_the_lua_health_check_names_only_phases_conditions_and_reasons_the_operator_has() -> None:
    names = lua_names(LUA.read_text())
    phases, reasons, conditions = set(Phase), set(Reason), set(ConditionType)
    assert names["phases"] and names["phases"] <= phases, names["phases"] - phases
    assert set(Phase) <= names["phases"], (
        f"phases the health check does not handle: {phases - names['phases']}"
    )
    looked_up = names["reason_sets"] | names["reasons"]
    assert looked_up and looked_up <= reasons, looked_up - reasons
    unknown = names["strings"] - phases - reasons - conditions - ARGOCD_HEALTH - CONDITION_STATUS
    assert unknown == {"NaN"}, f"names in the Lua that are none of kubetune's: {unknown - {'NaN'}}"


def test_the_name_check_sees_a_misspelt_name() -> None:
    """The reading above is not vacuous: a phase or reason the operator does not write is caught."""
    lua = (
        LUA.read_text()
        .replace('phase == "Failed"', 'phase == "Fail"', 1)
        .replace("ChildConflict", "ChildConflicts")
    )
    names = lua_names(lua)
    assert "Fail" in names["phases"] - set(Phase)
    assert "ChildConflicts" in names["reason_sets"] - set(Reason)


def test_kubetune_watch_uses_the_enums() -> None:
    from kubetune_cli import watch

    assert set(watch.PHASE_CONDITION) == set(Phase)
    assert all(isinstance(c, ConditionType) for cs in watch.PHASE_CONDITION.values() for c in cs)
    assert set(watch.FINAL) == {p for p in Phase if p.final}
