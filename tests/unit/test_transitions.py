"""Every guarded status update in the engine moves a row along an edge of the transition tables in
`stevora.statuses` (docs/state-machines.md): read from the source, so a new `update_run` /
`update_step` call that skips an edge fails here."""

from __future__ import annotations

import ast
from pathlib import Path

from stevora import statuses
from stevora.statuses import RUN_TRANSITIONS, STEP_TRANSITIONS, RunStatus, StepStatus

ROOT = Path(__file__).resolve().parents[2] / "stevora"
TABLES = {"update_run": (RunStatus, RUN_TRANSITIONS), "update_step": (StepStatus, STEP_TRANSITIONS)}


def _status(node: ast.expr, enum: type) -> object:
    assert isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name), ast.unparse(node)
    assert node.value.id == enum.__name__, ast.unparse(node)
    return enum[node.attr]


def _expected(node: ast.expr, enum: type) -> list[object]:
    if isinstance(node, ast.Name):  # a named group, e.g. ACTIVE_RUN_STATUSES
        return list(getattr(statuses, node.id))
    assert isinstance(node, (ast.List, ast.Tuple)), ast.unparse(node)
    return [_status(element, enum) for element in node.elts]


def _guarded_moves() -> list[tuple[str, str, list[object], object]]:
    """(where, helper, expected statuses, new status) of each call that sets a status."""
    moves = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            if node.func.attr not in TABLES:
                continue
            enum, _ = TABLES[node.func.attr]
            kwargs = {k.arg: k.value for k in node.keywords if k.arg}
            sets = kwargs.get("sets")
            if not isinstance(sets, ast.Dict) or "expect" not in kwargs:
                continue
            for key, value in zip(sets.keys, sets.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "status":
                    where = f"{path.relative_to(ROOT.parent)}:{node.lineno}"
                    moves.append(
                        (where, node.func.attr, _expected(kwargs["expect"], enum), _status(value, enum))
                    )
    return moves


def test_every_guarded_status_update_follows_the_transition_tables() -> None:
    moves = _guarded_moves()
    assert len(moves) >= 20, moves  # the scan finds the engine's updates
    for where, helper, expected, new in moves:
        _, table = TABLES[helper]
        for old in expected:
            assert old == new or new in table[old], f"{where}: {helper} {old} → {new} is not an edge"


def test_terminal_statuses_have_no_way_out_but_retry() -> None:
    assert {s for s, out in RUN_TRANSITIONS.items() if not out} == {RunStatus.COMPLETED, RunStatus.CANCELLED}
    assert RUN_TRANSITIONS[RunStatus.FAILED] == {RunStatus.RUNNING}  # `retry`
    assert set(RUN_TRANSITIONS) == set(RunStatus) and set(STEP_TRANSITIONS) == set(StepStatus)
