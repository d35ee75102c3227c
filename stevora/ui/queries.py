"""Read models for the UI pages, assembled from the shared reads in `stevora.db.reads` (every one
scoped to one workspace).

The run page's trace is assembled here: step runs in order, each llm step run with its rounds
(`llm_calls` by round), each round with its tool calls (`tool_trace` by sequence, joined to the
calls the model asked for, so a call still running shows up too) and the step's tool definitions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stevora.db import concurrency, map_items
from stevora.db import mcp as db_mcp
from stevora.db.budgets import UNCOUNTED_TOOL_ERROR
from stevora.db.definitions import find_version, workflow_input_schema
from stevora.db.reads import approvals as approval_reads
from stevora.db.reads import definitions as definition_reads
from stevora.db.reads import events as event_reads
from stevora.db.reads import runs as run_reads
from stevora.db.reads.approvals import ApprovalWithRun
from stevora.db.reads.definitions import DefinitionRef, DefinitionRow, DefinitionSummary
from stevora.db.reads.events import EventRow
from stevora.db.reads.rows import DbRow
from stevora.db.reads.runs import RunFilters, RunSummary, RunWithDefinition, StepRunRow
from stevora.db.reads.traces import LlmCallRow, ToolTraceRow
from stevora.engine.budget import BUDGET_SIGNAL
from stevora.engine.steps import llm_mcp
from stevora.llm.messages import reasoning_of
from stevora.statuses import RunStatus, values
from stevora.tools.invoke import parse_arguments

if TYPE_CHECKING:
    from stevora.runtime import Runtime

PAGE_SIZE = 25
EVENTS_SHOWN = 200
RUN_STATUSES = values(RunStatus)


@dataclass(slots=True)
class RunsPage:
    runs: list[RunSummary]
    total: int
    page: int
    pages: int


async def list_runs(rt: Runtime, workspace_id: str, filters: RunFilters, *, page: int) -> RunsPage:
    total = await run_reads.count(rt.pool, workspace_id, filters)
    count = max(1, math.ceil(total / PAGE_SIZE))
    page = min(max(1, page), count)
    rows = await run_reads.summaries(
        rt.pool, workspace_id, filters, limit=PAGE_SIZE, offset=(page - 1) * PAGE_SIZE
    )
    return RunsPage(runs=rows, total=total, page=page, pages=count)


async def definition_choices(rt: Runtime, workspace_id: str) -> list[DefinitionRef]:
    return await definition_reads.choices(rt.pool, workspace_id)


@dataclass(slots=True)
class ToolCallView:
    index: int
    name: str
    tool_call_id: str
    arguments: Any
    trace: ToolTraceRow | None  # None while the call has not finished (or never ran)

    @property
    def status(self) -> str:
        return self.trace["status"] if self.trace is not None else "pending"


@dataclass(slots=True)
class RoundView:
    call: LlmCallRow
    tool_calls: list[ToolCallView]

    @property
    def sent_messages(self) -> list[dict[str, Any]]:
        return list((self.call["request"] or {}).get("messages") or [])

    @property
    def text(self) -> str | None:
        return (self.call["response"] or {}).get("text")

    @property
    def thinking(self) -> list[str]:
        """The round's readable reasoning: Anthropic thinking text and OpenAI reasoning summaries.
        Redacted thinking and encrypted content are never shown."""
        return thinking_texts((self.call["response"] or {}).get("reasoning"))


def thinking_texts(stored: object) -> list[str]:
    texts: list[str] = []
    for reasoning in reasoning_of(stored):
        item = reasoning.item()
        if item.get("type") == "thinking" and isinstance(item.get("thinking"), str) and item["thinking"]:
            texts.append(item["thinking"])
        elif item.get("type") == "reasoning":
            texts += [
                p["text"]
                for p in item.get("summary") or ()
                if isinstance(p, dict) and isinstance(p.get("text"), str)
            ]
    return texts


@dataclass(slots=True)
class ToolDefView:
    name: str
    description: str | None
    parameters: Any
    source: str  # "inline" (declared in the definition), "registered" (looked up by name), "workflow", "mcp"


MAP_ITEMS_SHOWN = 200  # items listed under a `map` step on the run page (the counts cover all)


@dataclass(slots=True)
class StepView:
    row: StepRunRow
    rounds: list[RoundView] = field(default_factory=list)
    tools: list[ToolDefView] = field(default_factory=list)
    tool_trace: ToolTraceRow | None = None  # a `tool` step's call (no model call)
    # A `map` step's fan-out (its progress counters) and its first MAP_ITEMS_SHOWN items.
    fanout: DbRow | None = None
    map_items: list[DbRow] = field(default_factory=list)

    @property
    def cost_usd(self) -> float:
        return sum(r.call["cost_usd"] or 0 for r in self.rounds)

    @property
    def tool_call_count(self) -> int:
        return sum(len(r.tool_calls) for r in self.rounds)


@dataclass(slots=True)
class RunView:
    run: RunWithDefinition
    steps: list[StepView]
    events: list[EventRow]
    events_total: int
    # What the run used of its budget (`costCents, modelCalls, toolCalls`), when it has one.
    budget_used: dict[str, Any] | None = None
    # A queued run's place in its concurrency key's queue (1: next to start).
    queue_position: int | None = None
    # For a child run a `map` step started: `step_name, total, item_index` of its item.
    map_item: DbRow | None = None

    @property
    def waiting_for_budget(self) -> bool:
        """Whether the run waits for a person to raise its budget (`onBudgetExceeded: "pause"`)."""
        return any(s.row["status"] == "WAITING" and s.row["signal_type"] == BUDGET_SIGNAL for s in self.steps)

    @property
    def waiting_signal(self) -> str | None:
        """The signal type the run's current `external_event` step waits for, if any."""
        for step in reversed(self.steps):
            if step.row["status"] == "WAITING" and step.row["step_type"] == "external_event":
                return step.row["signal_type"]  # type: ignore[no-any-return]
        return None


def call_arguments(raw: Any) -> Any:
    """A call's arguments as its trace would hold them: the object, else the model's string (also
    when it is nested past what the page can render, as a hostile model may send)."""
    if isinstance(raw, str):
        parsed, is_object = parse_arguments(raw)
        return parsed if is_object else raw
    return raw


def _rounds(calls: list[LlmCallRow], traces: list[ToolTraceRow]) -> list[RoundView]:
    by_call: dict[str | None, dict[int, ToolTraceRow]] = {}
    for t in traces:
        by_call.setdefault(t["llm_call_id"], {})[t["sequence"]] = t
    rounds = []
    for call in calls:
        recorded = by_call.get(call["id"], {})
        requested = (call["response"] or {}).get("toolCalls") or []
        views = [
            ToolCallView(
                index=i,
                name=c.get("name", "?"),
                tool_call_id=c.get("id", ""),
                arguments=recorded[i]["input_json"]
                if i in recorded and recorded[i]["input_json"] is not None
                else call_arguments(c.get("arguments")),
                trace=recorded.get(i),
            )
            for i, c in enumerate(requested)
        ]
        rounds.append(RoundView(call=call, tool_calls=views))
    return rounds


def _step_entries(
    definition_steps: list[Any], step_name: str, offered: list[str] | None
) -> list[dict[str, Any]]:
    spec = next((s for s in definition_steps if isinstance(s, dict) and s.get("name") == step_name), None)
    if spec is None:
        return []
    # An `{"mcp": ...}` entry names a server, not a tool: its tools come in through `offered`.
    declared = [
        {"name": e} if isinstance(e, str) else e
        for e in spec.get("tools") or []
        if isinstance(e, str) or "mcp" not in e
    ]
    named = {e.get("name") for e in declared}
    return [*declared, *({"name": n} for n in offered or [] if n not in named)]


def _workflow_ref(rt: Runtime, entry: dict[str, Any]) -> tuple[str, str | None] | None:
    """The stored workflow an entry names: a workflow tool's, or a bare name's that is not a
    registered tool (resolved as the worker does: a registered tool first, else a workflow)."""
    if "workflow" in entry:
        return entry["workflow"], entry.get("version")
    if "parameters" not in entry and rt.tools.get(entry["name"]) is None:
        return entry["name"], None
    return None


async def stored_workflows(
    rt: Runtime, workspace_id: str, entries: list[dict[str, Any]]
) -> dict[tuple[str, str | None], DbRow]:
    """The stored definitions the entries' workflow tools name, by (name, version)."""
    found: dict[tuple[str, str | None], DbRow] = {}
    for ref in {r for e in entries if (r := _workflow_ref(rt, e)) is not None}:
        row = await find_version(rt.pool, workspace_id, ref[0], ref[1])
        if row is not None:
            found[ref] = row
    return found


def step_tools(
    rt: Runtime,
    definition_steps: list[Any],
    step_name: str,
    offered: list[str] | None = None,
    workflows: dict[tuple[str, str | None], DbRow] | None = None,
    mcp: dict[str, llm_mcp.McpTool] | None = None,
) -> list[ToolDefView]:
    """The tool definitions an llm step offers the model; references are looked up in the registry,
    workflow tools (and bare names that are no registered tool) in `workflows` (stored definitions).

    `offered` (the tool names a model call of this step was sent) adds what the definition does not
    list: the worker's global tools."""
    workflows = workflows or {}
    mcp = mcp or {}
    out = []
    for entry in _step_entries(definition_steps, step_name, offered):
        tool = mcp.get(entry["name"])
        if tool is not None:  # which server, and which version of it, the tool came from
            version = f"{tool.server_name or ''} {tool.server_version or ''}".strip()
            origin = f"MCP server '{tool.server}'" + (f" ({version})" if version else "")
            out.append(ToolDefView(entry["name"], f"{origin}: {tool.description}", tool.parameters, "mcp"))
            continue
        ref = _workflow_ref(rt, entry)
        row = workflows.get(ref) if ref is not None else None
        if "workflow" in entry or row is not None:
            assert ref is not None
            description = (
                entry.get("description")
                or (row["description"] if row is not None else None)
                or f"Runs the '{ref[0]}' workflow as a child run"
            )
            parameters = entry.get("parameters") or (workflow_input_schema(row) if row is not None else None)
            if parameters is None and row is not None:
                parameters = {"type": "object", "properties": {}}  # what the model is sent
            out.append(ToolDefView(entry["name"], description, parameters, "workflow"))
            continue
        if "parameters" in entry:
            out.append(ToolDefView(entry["name"], entry.get("description"), entry["parameters"], "inline"))
            continue
        registered = rt.tools.get(entry["name"])
        out.append(
            ToolDefView(
                entry["name"],
                registered.description if registered else None,
                registered.parameters if registered else None,
                "registered",
            )
        )
    return out


async def run_view(rt: Runtime, workspace_id: str, run_id: str) -> RunView | None:
    rows = await run_reads.run_page(rt.pool, workspace_id, run_id, events_shown=EVENTS_SHOWN)
    if rows is None:
        return None
    run, steps, calls, traces = rows.run, rows.steps, rows.calls, rows.traces
    calls_by_step: dict[str, list[LlmCallRow]] = {}
    for c in calls:
        calls_by_step.setdefault(c["step_run_id"], []).append(c)
    traces_by_step: dict[str, list[ToolTraceRow]] = {}
    for t in traces:
        traces_by_step.setdefault(t["step_run_id"], []).append(t)
    definition_steps = run["definition_steps"] or []
    offered_by_step: dict[str, list[str] | None] = {}
    for s in steps:
        if s["step_type"] == "llm":
            step_calls = calls_by_step.get(s["id"], [])
            offered_by_step[s["id"]] = (step_calls[0]["request"] or {}).get("tools") if step_calls else None
    entries = [
        e
        for s in steps
        if s["id"] in offered_by_step
        for e in _step_entries(definition_steps, s["step_name"], offered_by_step[s["id"]])
    ]
    workflows = await stored_workflows(rt, workspace_id, entries) if entries else {}
    mcp = await llm_mcp.offered_by_run(rt, run_id, run["definition_id"]) if offered_by_step else {}
    fanouts = {}
    if any(s["step_type"] == "map" for s in steps):
        fanouts = {m["step_run_id"]: m for m in await map_items.maps_of_run(rt.pool, run_id)}
    views = []
    for s in steps:
        view = StepView(row=s)
        if s["step_type"] == "llm":
            view.rounds = _rounds(calls_by_step.get(s["id"], []), traces_by_step.get(s["id"], []))
            offered = offered_by_step[s["id"]]
            view.tools = step_tools(rt, definition_steps, s["step_name"], offered, workflows, mcp)
        elif s["step_type"] == "tool":
            view.tool_trace = next(iter(traces_by_step.get(s["id"], [])), None)
        elif s["step_type"] == "map":
            view.fanout = fanouts.get(s["id"])
            if view.fanout is not None:
                view.map_items = await map_items.items(rt.pool, s["id"], MAP_ITEMS_SHOWN)
        views.append(view)
    used = None
    if run["budget"] is not None:
        # The same rule as the engine's (stevora.db.budgets), from the rows this page read anyway.
        used = {
            "costCents": run["total_cost_cents"],
            "modelCalls": len(calls),
            "toolCalls": sum(1 for t in traces if t["error_code"] != UNCOUNTED_TOOL_ERROR),
        }
    position = None
    if run["queued_at"] is not None and run["status"] == "PENDING":
        position = await concurrency.queue_position(rt.pool, run_id)
    item = None
    if run["parent_run_id"] is not None and run["parent_tool_call_id"] is None:
        item = await map_items.item_of_child(rt.pool, run_id)
    return RunView(
        run=run,
        steps=views,
        events=rows.events,
        events_total=rows.events_total,
        budget_used=used,
        queue_position=position,
        map_item=item,
    )


async def run_status(rt: Runtime, workspace_id: str, run_id: str) -> str | None:
    return await run_reads.status(rt.pool, workspace_id, run_id)


async def events_after(rt: Runtime, run_id: str, after: int) -> list[EventRow]:
    return await event_reads.after(rt.pool, run_id, after, limit=500)


async def approvals(rt: Runtime, workspace_id: str) -> tuple[list[ApprovalWithRun], list[ApprovalWithRun]]:
    """Pending requests (oldest first, the order to work through them) and the 10 latest decided."""
    return await approval_reads.to_work_through(rt.pool, workspace_id)


async def pending_approval_count(rt: Runtime, workspace_id: str) -> int:
    return await approval_reads.pending_count(rt.pool, workspace_id)


async def approval_run_id(rt: Runtime, workspace_id: str, approval_id: str) -> str | None:
    return await approval_reads.run_of(rt.pool, workspace_id, approval_id)


async def mcp_servers(rt: Runtime, workspace_id: str) -> tuple[list[DbRow], list[DbRow]]:
    """The workers' own MCP servers with their health, and the workspace's registered ones."""
    return await db_mcp.worker_servers(rt.pool), await db_mcp.registrations(rt.pool, workspace_id)


async def definitions(rt: Runtime, workspace_id: str) -> list[DefinitionSummary]:
    """The workspace's definitions, without the versions forks and replays derived."""
    return await definition_reads.summaries(rt.pool, workspace_id)


LATEST_RUNS = 10  # of a definition, on its page


async def derived_definition_count(rt: Runtime, workspace_id: str) -> int:
    return await definition_reads.derived_count(rt.pool, workspace_id)


async def definition(
    rt: Runtime, workspace_id: str, definition_id: str
) -> tuple[DefinitionRow, list[RunSummary]] | None:
    """A definition of the workspace and its latest runs."""
    row = await definition_reads.get(rt.pool, workspace_id, definition_id)
    if row is None:
        return None
    return row, await run_reads.of_definition(rt.pool, workspace_id, definition_id, LATEST_RUNS)
