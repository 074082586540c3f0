"""The reconciler makes no lifecycle decision (read from its source): it observes, asks
``state.advance`` and carries the actions out. No phase, reason or condition type of the API, no
question to the status (``status_view``), no verdict of the parent job, no exit choice and no
comparison of phases; of the state package it calls only ``advance`` (and builds its Observation,
Read... types)."""

from __future__ import annotations

import ast

from tests.support.controlplane import REPO

from kubetune_operator.state import status_view

RECONCILE = REPO / "operator" / "kubetune_operator" / "reconcile.py"
# the API's lifecycle vocabulary: naming one of these is deciding with it
ENUMS = {"Phase", "Reason", "EventReason", "ConditionType", "Reregister", "FINAL_PHASES"}
PREDICATES = {
    name for name in dir(status_view) if not name.startswith("_") and callable(getattr(status_view, name))
} - {"FineTuneJob", "FineTuneJobStatus", "StrEnum", "ConditionType", "Phase", "Reason"}
# what state offers beside advance that decides something
DECIDERS = PREDICATES | {
    "transition",
    "decide",
    "wanted",
    "alias_transition",
    "exits",
    "chaining",
    "machine",
    "lets_start",
    "started_from",
    "for_pass",
    "retry",
    "turned_on",
    "alias_move",
}


def decisions(source: str) -> list[str]:
    """Every place in ``source`` that decides something of the lifecycle (empty: none)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name) and node.id in ENUMS | PREDICATES:
            found.append(f"line {node.lineno}: {node.id}")
        elif isinstance(node, ast.Attribute) and (node.attr in ENUMS or _asks_a_decider(node)):
            found.append(f"line {node.lineno}: .{node.attr}")
        elif (
            isinstance(node, ast.ImportFrom)
            and node.module
            and (
                node.module.endswith("status") or "state" in node.module.split(".") or node.module == "parent"
            )
        ):
            names = {a.name for a in node.names} - {"FineTuneJobStatus"}
            if names:
                found.append(f"line {node.lineno}: from {node.module} import {sorted(names)}")
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_mentions_phase(o) for o in operands):
                found.append(f"line {node.lineno}: compares a phase")
    return found


def _asks_a_decider(node: ast.Attribute) -> bool:
    """``state.transition``, ``parent.lets_start``, ``state.exits``...: a decision made beside advance."""
    base = node.value
    modules = {"state", "parent", "chaining", "exits", "machine", "status_view", "wanted"}
    return isinstance(base, ast.Name) and base.id in modules and node.attr in DECIDERS


def _mentions_phase(node: ast.AST) -> bool:
    return any(
        (isinstance(n, ast.Attribute) and n.attr == "phase") or (isinstance(n, ast.Name) and n.id == "phase")
        for n in ast.walk(node)
    )


def test_the_reconciler_makes_no_lifecycle_decision() -> None:
    assert decisions(RECONCILE.read_text()) == []


def test_the_reconciler_asks_the_state_machine_once_per_step() -> None:
    tree = ast.parse(RECONCILE.read_text())
    asked = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and isinstance(n.func.value, ast.Name)
        and n.func.value.id == "state"
        and n.func.attr[:1].islower()
    ]
    assert [n.func.attr for n in asked] == ["advance"]  # type: ignore[attr-defined]


def test_the_shape_check_sees_a_decision() -> None:
    samples = {
        "if previous.phase == Phase.SUCCEEDED:\n    pass\n": 2,  # the enum, and the comparison
        "ok = state.training_succeeded(previous)\n": 1,
        "from .state.status_view import reopens\n": 1,
        "found = parent.lets_start(x)\n": 1,
        "if seen.phase != 'Failed':\n    pass\n": 1,
        "x = Reason.CHILD_REJECTED\n": 1,
    }
    for source, at_least in samples.items():
        assert len(decisions(source)) >= at_least, source
    assert decisions("obs = state.advance(obs)\n") == []
