"""The tool loop knows the awaited kinds only through their registry (docs/architecture.md,
"Where to add things": a way to answer a tool call is one module plus one registration line)."""

from __future__ import annotations

import ast
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar, cast

import structlog

from stevora.db.awaited import NewAwaitedCall
from stevora.db.checkpoints import CommittedRound
from stevora.definitions import LlmStep, LlmToolDef
from stevora.engine.steps.awaited.kind import CallKind, HandingOver, ToolEntry
from stevora.engine.steps.awaited_kinds import AWAITED_KINDS, AwaitedKinds
from stevora.engine.steps.base import StepExecution
from stevora.engine.steps.llm_state import LoopState
from stevora.engine.steps.llm_tool_runner import ToolRunner
from stevora.engine.steps.llm_tools import resolve_tools
from stevora.llm.messages import ToolCall
from stevora.statuses import AwaitedKind, PauseReason
from stevora.tools import ToolOutcome, ToolRegistry

ROOT = Path(__file__).resolve().parents[3]
# The tool loop: the `llm` step, the tools it offers, the runner of a round's calls, and the
# trace of a call. None of them may know which kinds exist.
LOOP_MODULES = [
    "stevora/engine/steps/llm.py",
    "stevora/engine/steps/llm_tools.py",
    "stevora/engine/steps/llm_tool_runner.py",
    "stevora/engine/steps/llm_state.py",
    "stevora/engine/steps/llm_model.py",
    "stevora/engine/steps/llm_recorded.py",
    "stevora/engine/steps/tool_calls.py",
]
KIND_MODULES = {type(kind).__module__ for kind in AWAITED_KINDS.kinds}


def _imported(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def test_the_registry_knows_every_awaited_kind_and_the_kind_modules_are_where_it_says() -> None:
    assert set(AWAITED_KINDS.by_kind) == set(AwaitedKind)
    assert KIND_MODULES == {
        "stevora.engine.steps.awaited.client",
        "stevora.engine.steps.awaited.workflow",
        "stevora.engine.steps.approval",
    }


def test_the_tool_loop_imports_no_awaited_kind_module() -> None:
    offenders = []
    for relative in LOOP_MODULES:
        imported = _imported(ast.parse((ROOT / relative).read_text()))
        offenders += [f"{relative}: imports {name}" for name in sorted(imported & KIND_MODULES)]
    assert not offenders, "\n".join(offenders)


def test_the_tool_loop_has_no_branch_on_a_kind() -> None:
    """No kind enum member, and no kind's name or pause reason as a string, in the loop's code
    (docstrings and comments may speak of them). Its pause-details key is not checked: the
    client kind's, `toolCalls`, is also the key of a model response's calls."""
    kind_strings = set()
    for kind in AWAITED_KINDS.kinds:
        kind_strings |= {str(kind.kind), str(kind.pause_reason)}
    enum_names = {"AwaitedKind", "AnsweredBy"}
    reasons = {reason.name for reason in (kind.pause_reason for kind in AWAITED_KINDS.kinds)}
    offenders = []
    for relative in LOOP_MODULES:
        tree = ast.parse((ROOT / relative).read_text())
        docstrings = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                if node.value.id in enum_names or (node.value.id == "PauseReason" and node.attr in reasons):
                    offenders.append(f"{relative}:{node.lineno}: {node.value.id}.{node.attr}")
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docstrings
                and node.value in kind_strings
            ):
                offenders.append(f"{relative}:{node.lineno}: {node.value!r}")
    assert not offenders, "\n".join(offenders)


class ToyKind(CallKind):
    """A made-up way to answer a tool call: a tool whose name starts with `toy_`, answered later
    by someone else, with a deadline of one minute."""

    kind = cast(AwaitedKind, "toy")
    pause_reason = cast(PauseReason, "toy_answer")
    pause_rank = 5
    details_key = "toyCalls"
    prepared: ClassVar[list[HandingOver]] = []

    def answers(self, tool: ToolEntry) -> bool:
        return isinstance(tool, LlmToolDef) and tool.name.startswith("toy_")

    async def prepare(self, handing: HandingOver) -> NewAwaitedCall | ToolOutcome:
        self.prepared.append(handing)
        return replace(handing.call, deadline_at=datetime(2030, 1, 1, tzinfo=UTC))

    def pause_detail(self, call: NewAwaitedCall, tool: ToolEntry) -> dict[str, Any]:
        return {"id": call.tool_call_id, "toy": True}


async def test_a_new_kind_is_its_module_and_one_registration() -> None:
    """Registered beside today's kinds, a toy kind's calls are handed over by the unchanged loop:
    its `prepare` returns the row, and the step waits with its reason, details and deadline."""
    kinds = AwaitedKinds([*AWAITED_KINDS.kinds, ToyKind()])
    step = LlmStep.model_validate(
        {
            "type": "llm",
            "name": "ask",
            "model": "scripted",
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [
                {
                    "name": "toy_lookup",
                    "description": "Answered by a toy",
                    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
                }
            ],
        }
    )
    settings = SimpleNamespace(
        max_tool_output_bytes=1000, max_json_depth=64, max_state_bytes=None, max_attachment_bytes=None
    )
    rt: Any = SimpleNamespace(tools=ToolRegistry(), pool=None, settings=settings, faults=None)
    tools = await resolve_tools(rt, "ws", step, kinds)
    assert tools.offered == {"toy_lookup": "toy"}
    ex = StepExecution("run", "ws", "owner", "sr", "ask", 0, 1, 1, {}, {}, None)
    runner = ToolRunner(rt, ex, step, tools, structlog.get_logger())
    runner.recorded = None  # not a replay: nothing to read
    committed = datetime(2026, 1, 1, tzinfo=UTC)
    last = CommittedRound("llm1", "sr", 1, "scripted", None, {}, {}, 0.0, 0, 0, {}, committed)
    st = LoopState(transcript=[], rounds=[last], next_round=2, tool_rounds=1)

    waiting = await runner.run_missing(st, last, (ToolCall("c1", "toy_lookup", '{"q": "x"}'),))

    assert waiting is not None and waiting.status == "waiting"
    assert waiting.pause_reason == "toy_answer"
    assert waiting.pause_details == {"toyCalls": [{"id": "c1", "toy": True}]}
    assert waiting.wait_until == datetime(2030, 1, 1, tzinfo=UTC)
    [handed] = waiting.awaiting or []
    assert (handed.kind, handed.tool_name, handed.arguments, handed.sequence) == (
        "toy",
        "toy_lookup",
        {"q": "x"},
        0,
    )
    [handing] = ToyKind.prepared
    assert handing.committed_at == committed and handing.call.arguments == {"q": "x"}
