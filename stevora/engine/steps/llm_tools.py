"""The `llm` step's tools: which tools the model is offered, and who answers each one's calls.

Two ways to answer a call (see docs/tool-calling.md):
* a handler registered in the worker runs it here, in the loop (`llm_tool_runner`);
* an awaited kind answers it from outside the loop (stevora.engine.steps.awaited_kinds: the API
  caller, a child run): the round's handler calls run first, then the step waits, durably, for
  the rest. A kind may also gate a handler tool (a person approves each call before it runs).
Nothing here names a kind: the registry says which kind answers or gates an entry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from stevora.db.checkpoints import CommittedRound
from stevora.definitions import LlmStep, LlmToolDef, McpToolsDef, ToolRef, WorkflowToolDef
from stevora.engine.steps import llm_mcp
from stevora.engine.steps.awaited_kinds import AWAITED_KINDS, AwaitedKinds
from stevora.errors import StevoraError
from stevora.llm.messages import ToolCall, ToolSpec
from stevora.statuses import AwaitedKind
from stevora.tools.registry import RegisteredTool
from stevora.tools.toolbox import toolbox_tools

if TYPE_CHECKING:
    from stevora.runtime import Runtime


@dataclass(slots=True)
class StepTools:
    specs: list[ToolSpec]
    declared: dict[str, dict[str, Any]]  # schemas declared in the step, validated before a call runs
    # Every tool the step offers, by its exact name, and the kind that answers its calls from
    # outside (None: a handler here). A call of any other name never runs (TOOL_NOT_OFFERED),
    # whatever the worker has registered — the tool boundary.
    offered: dict[str, AwaitedKind | None] = field(default_factory=dict)
    gated: dict[str, AwaitedKind] = field(default_factory=dict)  # handler tools a kind gates
    # The step's own entry for its inline and kind-offered tools: what a kind reads at hand-over.
    entries: dict[str, LlmToolDef | WorkflowToolDef] = field(default_factory=dict)
    timeouts_ms: dict[str, int] = field(default_factory=dict)
    output_schemas: dict[str, dict[str, Any]] = field(default_factory=dict)  # inline outputSchema
    kinds: AwaitedKinds = AWAITED_KINDS
    # MCP tools (docs/mcp.md) run in the loop like handlers; this says where their calls go.
    mcp: dict[str, llm_mcp.McpTool] = field(default_factory=dict)

    def add_handler(self, tool: RegisteredTool) -> None:
        """A registered tool (by name, a toolbox's member, a global tool), run here."""
        self.specs.append(ToolSpec(tool.name, tool.description, dict(tool.parameters)))
        self.offered[tool.name] = None
        self._gate(tool.name, None, tool)

    def add_mcp(self, tool: llm_mcp.McpTool) -> None:
        """A pinned MCP tool, run here; gated like a registered tool when the entry's `approve` names it."""
        self.specs.append(ToolSpec(tool.name, tool.description, tool.parameters))
        self.declared[tool.name] = tool.parameters
        self.offered[tool.name] = None
        self.mcp[tool.name] = tool
        self._gate(tool.name, None, cast(RegisteredTool, tool))  # the gate reads `requires_approval`

    def _gate(self, name: str, entry: LlmToolDef | None, registered: RegisteredTool | None) -> None:
        gate = self.kinds.gating(entry, registered)
        if gate is not None:
            self.gated[name] = gate


async def resolve_tools(
    rt: Runtime,
    workspace_id: str,
    step: LlmStep,
    kinds: AwaitedKinds = AWAITED_KINDS,
    *,
    run_id: str | None = None,
) -> StepTools:
    """The tools the step offers; `kinds`: the awaited kinds that may answer or gate them;
    `run_id`: the run whose pinned MCP tool lists an `{"mcp": ...}` entry offers."""
    tools = StepTools(specs=[], declared={}, kinds=kinds)
    servers = [entry for entry in step.tools if isinstance(entry, McpToolsDef)]
    for entry in step.tools:
        if isinstance(entry, McpToolsDef):
            continue
        registered = rt.tools.get(entry.name)
        if isinstance(entry, LlmToolDef):
            tools.specs.append(ToolSpec(entry.name, entry.description, dict(entry.parameters)))
            tools.declared[entry.name] = dict(entry.parameters)
            tools.offered[entry.name] = kinds.answering(entry)
            tools.entries[entry.name] = entry
            if entry.timeout_ms is not None:
                tools.timeouts_ms[entry.name] = entry.timeout_ms
            if entry.output_schema is not None:
                tools.output_schemas[entry.name] = entry.output_schema
            tools._gate(entry.name, entry, registered)
            continue
        boxed = (
            toolbox_tools(rt.tools, entry.name) if registered is None and isinstance(entry, ToolRef) else []
        )
        if boxed:  # a toolbox's prefix: all its tools
            for member in boxed:
                tools.add_handler(member)
            continue
        # A kind's own form (a workflow tool), or a bare name no handler is registered for (a
        # stored workflow of that name, Dagu's form).
        offered = (
            await kinds.offer(rt, workspace_id, entry)
            if registered is None or not isinstance(entry, ToolRef)
            else None
        )
        if offered is not None:
            tools.specs.append(offered.spec)
            tools.declared[entry.name] = offered.spec.parameters
            tools.offered[entry.name] = kinds.answering(offered.entry)
            tools.entries[entry.name] = offered.entry
            continue
        if registered is None:
            raise StevoraError(
                f"Step '{step.name}' references tool '{entry.name}', which is not registered in this worker "
                f"nor a workflow of this workspace: register it with `@tool` or `register_tool` in a "
                f"module loaded with `stevora worker --tools MODULE` (or `stevora dev --tools MODULE`)",
                code="TOOL_NOT_REGISTERED",
                retryable=False,
            )
        tools.add_handler(registered)
    if servers:
        assert run_id is not None, "MCP tools are pinned per run"
        for mcp_tool in await llm_mcp.resolve(
            rt, run_id=run_id, workspace_id=workspace_id, step_name=step.name, entries=servers
        ):
            tools.add_mcp(mcp_tool)
    if step.global_tools:
        for registered in rt.tools:
            if registered.is_global and registered.name not in tools.offered:
                tools.add_handler(registered)
    return tools


def first_goto(last: CommittedRound, calls: tuple[ToolCall, ...]) -> tuple[int, str] | None:
    """The first of the round's calls (in the model's order) whose handler called `ctx.goto`, and
    its target: from the committed traces, so a resumed step goes where the lost one would have."""
    for index in range(len(calls)):
        trace = last.tool_results.get(index)
        if trace is not None and trace["goto_step"] is not None:
            return index, trace["goto_step"]
    return None
