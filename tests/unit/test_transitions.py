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
    if isinstance(node, ast.Call) and ast.unparse(node.func) == "list" and len(node.args) == 1:
        node = node.args[0]  # list(OPEN_STEP_STATUSES)
    if isinstance(node, ast.Name):  # a named group, e.g. ACTIVE_RUN_STATUSES
        return list(getattr(statuses, node.id))
    assert isinstance(node, (ast.List, ast.Tuple)), ast.unparse(node)
    return [_status(element, enum) for element in node.elts]


def _guarded_moves() -> list[tuple[str, str, list[object], object]]:
    """(where, helper, expected statuses, new status) of each call that sets a status. A helper
    that passes its own `expect` parameter on (e.g. `endings.fail_run`) is checked with that
    parameter's default and with the `expect=` of every call to it."""
    moves = []
    forwarders: dict[str, tuple[str, type, object]] = {}  # function → (helper, enum, new status)
    trees = {path: ast.parse(path.read_text()) for path in sorted(ROOT.rglob("*.py"))}
    for path, tree in trees.items():
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
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
                    expect = kwargs["expect"]
                    if isinstance(expect, ast.Name) and not hasattr(statuses, expect.id):
                        function = node
                        while not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                            function = parents[function]
                        params = function.args.kwonlyargs
                        defaults = dict(zip([a.arg for a in params], function.args.kw_defaults, strict=True))
                        default = defaults.get(expect.id)
                        assert default is not None, f"{where}: expect={expect.id} has no default"
                        forwarders[function.name] = (node.func.attr, enum, _status(value, enum))
                        expect = default
                    moves.append((where, node.func.attr, _expected(expect, enum), _status(value, enum)))
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if name not in forwarders:
                continue
            helper, enum, new = forwarders[name]
            for k in node.keywords:
                if k.arg == "expect":
                    where = f"{path.relative_to(ROOT.parent)}:{node.lineno}"
                    moves.append((where, helper, _expected(k.value, enum), new))
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
