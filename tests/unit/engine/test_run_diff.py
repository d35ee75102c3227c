"""Aligning two runs' model calls (stevora/engine/run_diff.py, shared by `stevora runs diff` and
the UI's diff view)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Any

from stevora.engine import run_diff
from stevora.engine.run_diff import CallRow, TraceRow, align, diff_rows


def _call(
    call_id: str, step: str, rnd: int, text: str | None = None, tools: int = 0, status: str = "completed"
) -> CallRow:
    response: dict[str, Any] = {
        "text": text,
        "toolCalls": [{"id": f"{call_id}-{i}", "name": "t", "arguments": {"i": i}} for i in range(tools)],
    }
    return CallRow(call_id, step, rnd, status, "m", response, 10, 5, 0.001, 12.0)


def _result(call_id: str, sequence: int, output: Any, status: str = "completed") -> TraceRow:
    return TraceRow(call_id, sequence, status, output, None if status == "completed" else "boom")


def test_rows_align_by_step_visit_and_round_and_mark_the_first_difference_only() -> None:
    a = (
        [_call("a1", "s", 1, tools=1), _call("a2", "s", 2, text="done"), _call("a3", "s", 1, text="again")],
        [_result("a1", 0, "r")],
    )
    b = (
        [_call("b1", "s", 1, tools=1), _call("b2", "s", 2, text="other"), _call("b3", "s", 1, text="later"),
         _call("b4", "s", 2, text="extra")],
        [_result("b1", 0, "r")],
    )  # fmt: skip
    rows = align(a, b)
    assert [(r.step_name, r.visit, r.round, r.same, r.first_divergence) for r in rows] == [
        ("s", 1, 1, True, False),
        ("s", 1, 2, False, True),
        ("s", 2, 1, False, False),  # the step's second visit
        ("s", 2, 2, False, False),  # only in B
    ]
    assert rows[3].a is None and rows[3].b is not None and rows[3].b.call_id == "b4"
    assert diff_rows(a, b)[1]["b"]["text"] == "other"


def test_results_in_sequence_order_and_a_failed_result_compares_by_its_error() -> None:
    calls = [_call("c", "s", 1, tools=2)]
    a = align(
        (calls, [_result("c", 1, "second"), _result("c", 0, "first")]),
        (calls, [_result("c", 0, "first"), _result("c", 1, None, "failed")]),
    )
    assert a[0].a is not None and a[0].a.results == ["first", "second"]
    assert a[0].b is not None and a[0].b.results == ["first", {"error": "boom"}]
    assert a[0].first_divergence


def test_failed_model_calls_are_left_out() -> None:
    rows = align(([_call("x", "s", 1, status="failed")], []), ([], []))
    assert rows == []


def test_the_module_imports_only_the_standard_library() -> None:
    """`stevora runs diff` runs from a client-only install (no server dependencies)."""
    tree = ast.parse(Path(run_diff.__file__).read_text())
    imported = {
        (node.module or "").split(".")[0] if isinstance(node, ast.ImportFrom) else alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert imported - {"__future__"} <= sys.stdlib_module_names
