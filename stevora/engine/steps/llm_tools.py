"""The `llm` step's tool calls: which tools the model is offered, and running the calls of a round.

Three kinds of tool (see docs/tool-calling.md):
* `handler` — run here, by the handler registered in the worker; each call is committed with its
  event in one statement (`tool_trace` + `TOOL_CALL_*`). A committed call never runs again; a
  handler that ran but whose commit did not happen runs again with the same idempotency key
  (`<stepRunId>:<round>:<callIndex>`): at-least-once handlers, exactly-once records.
* `client` — handed to the API caller; * `workflow` — run as a child run. Both are answered from
  outside the loop (stevora.engine.steps.awaited): the round's handler calls run first, then the
  step waits, durably, for the rest.
A handler tool that `requiresApproval` waits for a person's decision first (an approval request);
once approved (or edited) the resumed step runs it; rejected, the model gets an error result.
Handlers see the run through `ToolContext` (input, a state snapshot) and may `update_state`.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from datetime import timedelta
from operator import itemgetter
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

import structlog

from stevora.db import awaited as db_awaited
from stevora.db.awaited import NewAwaitedCall
from stevora.db.budgets import UNCOUNTED_TOOL_ERROR
from stevora.db.checkpoints import CommittedRound
from stevora.db.database import storable_text
from stevora.db.definitions import find_version, workflow_input_schema
from stevora.definitions import LlmStep, LlmToolDef, McpToolsDef, WorkflowToolDef
from stevora.engine.budget import Meter
from stevora.engine.steps import llm_mcp
from stevora.engine.steps.awaited import tool_call_view
from stevora.engine.steps.awaited.workflow import nesting_problem
from stevora.engine.steps.base import StepExecution
from stevora.engine.steps.llm_recorded import RecordedTools
from stevora.engine.steps.llm_state import LoopState
from stevora.engine.steps.tool_calls import TOOL_CALL_ID_WIDTH, column_text, record_outcome
from stevora.errors import BudgetExceeded, StevoraError
from stevora.llm.messages import Message, ToolCall, ToolSpec
from stevora.observability import hooks as observe
from stevora.statuses import AwaitedKind, AwaitedStatus, PauseReason
from stevora.tasks import StepResult
from stevora.tools import ToolContext, ToolErrorCode, ToolOutcome, invoke_tool, schema_problems, with_defaults
from stevora.tools.invoke import parse_arguments
from stevora.tools.toolbox import toolbox_tools

if TYPE_CHECKING:
    from stevora.runtime import Runtime

ToolKind = Literal["handler", "client", "workflow"]
_UNREAD = object()
_INDEX = itemgetter(0)


@dataclass(slots=True)
class StepTools:
    specs: list[ToolSpec]
    declared: dict[str, dict[str, Any]]  # schemas declared in the step, validated before a call runs
    # Every tool the step offers, by its exact name: a call of any other name never runs
    # (TOOL_NOT_OFFERED), whatever the worker has registered — the tool boundary.
    kinds: dict[str, ToolKind] = field(default_factory=dict)
    timeouts_ms: dict[str, int] = field(default_factory=dict)
    expiries_ms: dict[str, int] = field(default_factory=dict)  # client tools' outputsExpireAfterMs
    workflows: dict[str, WorkflowToolDef] = field(default_factory=dict)
    output_schemas: dict[str, dict[str, Any]] = field(default_factory=dict)  # inline outputSchema
    gated: set[str] = field(default_factory=set)  # handler tools that need a person's approval
    # MCP tools (docs/mcp.md) run inline like handlers (kind "handler"); this says where they go.
    mcp: dict[str, llm_mcp.McpTool] = field(default_factory=dict)


async def resolve_tools(
    rt: Runtime, workspace_id: str, step: LlmStep, *, run_id: str | None = None
) -> StepTools:
    tools = StepTools(specs=[], declared={})
    servers = [entry for entry in step.tools if isinstance(entry, McpToolsDef)]
    for entry in step.tools:
        if isinstance(entry, McpToolsDef):
            continue
        if isinstance(entry, LlmToolDef):
            tools.specs.append(ToolSpec(entry.name, entry.description, dict(entry.parameters)))
            tools.declared[entry.name] = dict(entry.parameters)
            tools.kinds[entry.name] = entry.execution
            if entry.timeout_ms is not None:
                tools.timeouts_ms[entry.name] = entry.timeout_ms
            expiry_ms = client_expiry_ms(step, entry)
            if expiry_ms is not None:
                tools.expiries_ms[entry.name] = expiry_ms
            if entry.output_schema is not None:
                tools.output_schemas[entry.name] = entry.output_schema
            registered = rt.tools.get(entry.name)
            if entry.requires_approval or (registered is not None and registered.requires_approval):
                tools.gated.add(entry.name)
            continue
        registered = rt.tools.get(entry.name)
        boxed = [] if registered is not None else toolbox_tools(rt.tools, entry.name)
        if boxed and not isinstance(entry, WorkflowToolDef):  # a toolbox's prefix: all its tools
            for member in boxed:
                tools.specs.append(ToolSpec(member.name, member.description, dict(member.parameters)))
                tools.kinds[member.name] = "handler"
                if member.requires_approval:
                    tools.gated.add(member.name)
            continue
        if registered is None and not isinstance(entry, WorkflowToolDef):
            # A bare name: a registered tool, else a stored workflow of that name (Dagu's form).
            if await find_version(rt.pool, workspace_id, entry.name, None) is not None:
                entry = WorkflowToolDef(name=entry.name, workflow=entry.name)
        if isinstance(entry, WorkflowToolDef):
            spec = await _workflow_tool_spec(rt, workspace_id, entry)
            tools.specs.append(spec)
            tools.declared[entry.name] = spec.parameters
            tools.kinds[entry.name] = "workflow"
            tools.workflows[entry.name] = entry
            continue
        if registered is None:
            raise StevoraError(
                f"Step '{step.name}' references tool '{entry.name}', which is not registered in this worker "
                f"(load its module with `stevora worker --tools MODULE`) nor a workflow of this workspace",
                code="TOOL_NOT_REGISTERED",
                retryable=False,
            )
        tools.specs.append(ToolSpec(registered.name, registered.description, dict(registered.parameters)))
        tools.kinds[registered.name] = "handler"
        if registered.requires_approval:
            tools.gated.add(registered.name)
    if servers:
        assert run_id is not None, "MCP tools are pinned per run"
        for offered in await llm_mcp.resolve(
            rt, run_id=run_id, workspace_id=workspace_id, step_name=step.name, entries=servers
        ):
            tools.specs.append(ToolSpec(offered.name, offered.description, offered.parameters))
            tools.declared[offered.name] = offered.parameters
            tools.kinds[offered.name] = "handler"
            tools.mcp[offered.name] = offered
            if offered.approve:
                tools.gated.add(offered.name)
    if step.global_tools:
        named = {spec.name for spec in tools.specs}
        for registered in rt.tools:
            if registered.is_global and registered.name not in named:
                tools.specs.append(
                    ToolSpec(registered.name, registered.description, dict(registered.parameters))
                )
                tools.kinds[registered.name] = "handler"
                if registered.requires_approval:
                    tools.gated.add(registered.name)
    return tools


def client_expiry_ms(step: LlmStep, tool: LlmToolDef) -> int | None:
    """How long a client tool's output may be missing before the run fails with CONTEXT_EXPIRED."""
    if tool.execution != "client":
        return None
    return tool.outputs_expire_after_ms or step.outputs_expire_after_ms


def expires_first(step: LlmStep, tool: LlmToolDef | None) -> bool:
    """Whether a client call's deadline is its expiry (the run fails) rather than its own
    `timeoutMs` (the call fails and the loop goes on): the earlier one is the deadline."""
    if tool is None:
        return False
    expiry_ms = client_expiry_ms(step, tool)
    return expiry_ms is not None and (tool.timeout_ms is None or expiry_ms <= tool.timeout_ms)


async def _workflow_tool_spec(rt: Runtime, workspace_id: str, tool: WorkflowToolDef) -> ToolSpec:
    row = await find_version(rt.pool, workspace_id, tool.workflow, tool.version)
    parameters = tool.parameters or (workflow_input_schema(row) if row is not None else None)
    description = tool.description or (row["description"] if row is not None else None)
    return ToolSpec(
        tool.name,
        description or f"Run the '{tool.workflow}' workflow",
        parameters or {"type": "object", "properties": {}},
    )


def first_goto(last: CommittedRound, calls: tuple[ToolCall, ...]) -> tuple[int, str] | None:
    """The first of the round's calls (in the model's order) whose handler called `ctx.goto`, and
    its target: from the committed traces, so a resumed step goes where the lost one would have."""
    for index in range(len(calls)):
        trace = last.tool_results.get(index)
        if trace is not None and trace["goto_step"] is not None:
            return index, trace["goto_step"]
    return None


def _failed(arguments: dict[str, Any], code: ToolErrorCode, error: str) -> ToolOutcome:
    return ToolOutcome(
        status="failed",
        input=arguments,
        output=None,
        error=error,
        error_code=code,
        duration_ms=0.0,
        result_text=json.dumps({"error": error}, ensure_ascii=False),
    )


class ToolRunner:
    """Runs the tool calls of a committed round that have no trace yet."""

    def __init__(
        self,
        rt: Runtime,
        ex: StepExecution,
        step: LlmStep,
        tools: StepTools,
        log: structlog.typing.FilteringBoundLogger,
    ) -> None:
        self.rt = rt
        self.ex = ex
        self.step = step
        self.tools = tools
        self.log = log
        self.state = dict(ex.state)  # the run's state as this step's tools have left it
        self._observe = observe.ToolCalls(ex.step_run_id)  # metric children bound once per visit
        self.meter: Meter | None = None  # the run's budget, when it has one
        # A replay with recorded tools answers calls from its origin's results (read on first use).
        self.recorded: RecordedTools | object | None = _UNREAD
        # The round's conversation and its length, which `ctx.transcript` reads (and `ctx.goto` needs).
        self.steering: tuple[list[Message], int] = ([], 0)
        # Whether a round may hold a goto: a call of this execution went somewhere, or the step
        # resumed from committed rounds. Until then the loop does not look (`first_goto`).
        self.steered = False

    async def run_missing(
        self, st: LoopState, last: CommittedRound, calls: tuple[ToolCall, ...]
    ) -> StepResult | None:
        """Run the round's untraced handler calls; hand the others over. Returns a waiting
        StepResult when some calls are now answered from outside, else None (all traced)."""
        missing = [(i, c) for i, c in enumerate(calls) if i not in last.tool_results]
        if not missing:
            return None
        self.steering = (st.transcript, len(st.transcript))
        by_index: dict[int, dict[str, Any]] = {}
        if self.recorded is _UNREAD:
            self.recorded = await RecordedTools.load(self.rt.pool, self.ex.run_id)
        if isinstance(self.recorded, RecordedTools):  # a replay: calls answered from the recording
            live = []
            for index, call in missing:
                answer = self.recorded.answer(call)
                if answer is None:  # unmatched, and the replay runs those live: as in any run
                    live.append((index, call))
                else:
                    by_index[index] = await self._record(last, index, call, *answer)
            if not live:
                self._deliver(st, calls, last, by_index)
                return None
            missing = live
        # One pass sorts the calls: not offered (recorded at once, never run), run here, gated
        # (run once a person approved them), answered from outside.
        kinds, gated = self.tools.kinds, self.tools.gated
        local: list[tuple[int, ToolCall]] = []
        outside: list[tuple[int, ToolCall]] = []
        waiting_approval: list[tuple[int, ToolCall]] = []
        for index, call in missing:
            name = call.name
            if name not in kinds:  # never looked up in the registry, never gated, never run
                by_index[index] = await self._record(last, index, call, self._not_offered(call))
            elif kinds[name] != "handler":
                outside.append((index, call))
            elif name in gated:
                waiting_approval.append((index, call))
            else:
                local.append((index, call))
        handed: list[NewAwaitedCall] = []
        approved: dict[int, Any] = {}
        if waiting_approval:
            decided = {
                row["sequence"]: row
                for row in await db_awaited.for_step_run(self.rt.pool, [last.step_run_id])
                if row["llm_call_id"] == last.llm_call_id and row["status"] == AwaitedStatus.APPROVED
            }
            for index, call in waiting_approval:
                if index in decided:
                    approved[index] = decided[index]["approved_arguments"]
                    local.append((index, call))
                else:
                    outside.append((index, call))
            local.sort(key=_INDEX)  # the model's order
        over_budget = False
        if self.meter is not None:
            left = self.meter.tool_calls_left()
            if left is not None and len(local) + len(outside) > left:
                # Handler calls run in the model's order up to the limit; nothing is handed over
                # (a step cannot wait for outputs and for a budget at once). The rest wait, or fail.
                local, outside, over_budget = local[:left], [], True
        if self.step.parallel_tool_calls and len(local) > 1:
            results = await asyncio.gather(*(self._run_tool(last, i, c, approved.get(i)) for i, c in local))
            by_index.update(zip((i for i, _ in local), results, strict=True))
        else:
            for index, call in local:
                by_index[index] = await self._run_tool(
                    last, index, call, approved[index] if index in approved else None
                )
        if over_budget:
            raise BudgetExceeded("maxToolCalls")
        for index, call in sorted(outside, key=_INDEX):
            immediate = await self._hand_over(last, index, call, handed)
            if immediate is not None:
                by_index[index] = await self._record(last, index, call, immediate)
        if handed:
            return self._waiting(handed)
        self._deliver(st, calls, last, by_index)
        return None

    def _deliver(
        self,
        st: LoopState,
        calls: tuple[ToolCall, ...],
        last: CommittedRound,
        by_index: dict[int, dict[str, Any]],
    ) -> None:
        # The model sees results in its own call order, whatever order they finished in.
        for index, call in enumerate(calls):
            if index in by_index:
                trace = by_index[index]
                last.tool_results[index] = trace
                st.transcript.append(
                    Message.tool_result(
                        call.id, trace["text"], name=call.name, is_error=trace["status"] != "completed"
                    )
                )

    def _not_offered(self, call: ToolCall) -> ToolOutcome:
        arguments, _ = parse_arguments(call.arguments)
        offered = ", ".join(sorted(self.tools.kinds)) or "none"
        # repr() so an empty, blank or look-alike name is visible as what it is.
        return _failed(
            arguments,
            "TOOL_NOT_OFFERED",
            f"Tool {call.name[:80]!r} is not offered in this step (offered: {offered})",
        )

    async def _hand_over(
        self, last: CommittedRound, index: int, call: ToolCall, handed: list[NewAwaitedCall]
    ) -> ToolOutcome | None:
        """Queue a client or workflow call in `handed`, or return the failure the model gets at once."""
        arguments, is_object = parse_arguments(call.arguments)
        schema = self.tools.declared.get(call.name)
        if schema is None and call.name in self.tools.gated:
            schema = self._registered_parameters(call.name)
        if is_object and schema is not None:
            problems = schema_problems(schema, arguments)
            if problems:
                return _failed(
                    arguments,
                    "INVALID_ARGUMENTS",
                    f"Invalid arguments for tool '{call.name}': {'; '.join(problems)}",
                )
        new = NewAwaitedCall(
            llm_call_id=last.llm_call_id,
            step_run_id=last.step_run_id,
            round=last.round,
            sequence=index,
            tool_call_id=column_text(call.id, TOOL_CALL_ID_WIDTH),
            tool_name=call.name,  # offered: a valid tool name
            arguments=arguments,
            kind=AwaitedKind.CLIENT,
        )
        if call.name in self.tools.gated:
            new.kind = AwaitedKind.APPROVAL
            new.parameters = schema if schema is not None else self._registered_parameters(call.name)
            handed.append(new)
            return None
        if self.tools.kinds[call.name] == "client":
            limits = [self.tools.timeouts_ms.get(call.name), self.tools.expiries_ms.get(call.name)]
            due_ms = [ms for ms in limits if ms is not None]
            if due_ms:  # the earlier of the call's timeout and its expiry (`on_due` tells which)
                new.deadline_at = last.committed_at + timedelta(milliseconds=min(due_ms))
            handed.append(new)
            return None
        failure = await self._plan_child(self.tools.workflows[call.name], arguments, new)
        if failure is None:
            handed.append(new)
        return failure

    async def _plan_child(
        self, tool: WorkflowToolDef, arguments: dict[str, Any], new: NewAwaitedCall
    ) -> ToolOutcome | None:
        row = await find_version(self.rt.pool, self.ex.workspace_id, tool.workflow, tool.version)
        if row is None:
            what = f"'{tool.workflow}'" + (f" version '{tool.version}'" if tool.version else "")
            return _failed(arguments, "WORKFLOW_NOT_FOUND", f"Workflow {what} does not exist")
        nesting = await nesting_problem(self.rt, self.ex.run_id, tool.workflow)
        if nesting is not None:
            if nesting.code == "WORKFLOW_RECURSION":
                message = f"Workflow '{tool.workflow}' is already running above this call ({nesting.path})"
            else:
                message = f"Calling workflow '{tool.workflow}' would nest runs {nesting.depth} deep (limit {nesting.limit})"
            return _failed(arguments, nesting.code, message)
        child_input = arguments
        schema = workflow_input_schema(row)
        if schema is not None:
            child_input = with_defaults(schema, arguments)
            problems = schema_problems(schema, child_input)
            if problems:
                return _failed(
                    arguments,
                    "INVALID_ARGUMENTS",
                    f"Invalid input for workflow '{tool.workflow}': {'; '.join(problems)}",
                )
        new.kind = AwaitedKind.WORKFLOW
        new.child_definition_id = row["id"]
        new.child_input = child_input
        return None

    def _registered_parameters(self, name: str) -> dict[str, Any] | None:
        registered = self.rt.tools.get(name)
        return dict(registered.parameters) if registered is not None else None

    def _waiting(self, handed: list[NewAwaitedCall]) -> StepResult:
        client = [c for c in handed if c.kind == AwaitedKind.CLIENT]
        children = [c for c in handed if c.kind == AwaitedKind.WORKFLOW]
        gated = [c for c in handed if c.kind == AwaitedKind.APPROVAL]
        deadlines = [c.deadline_at for c in client if c.deadline_at is not None]
        details: dict[str, Any] = {}
        if client:
            details["toolCalls"] = [
                tool_call_view(
                    {"tool_call_id": c.tool_call_id, "tool_name": c.tool_name, "arguments": c.arguments}
                )
                for c in client
            ]
        if children:
            details["workflowCalls"] = [
                {
                    "id": c.tool_call_id,
                    "name": c.tool_name,
                    "workflow": self.tools.workflows[c.tool_name].workflow,
                }
                for c in children
            ]
        if gated:
            details["approvalCalls"] = [{"id": c.tool_call_id, "name": c.tool_name} for c in gated]
        reason = (
            PauseReason.TOOL_OUTPUTS
            if client
            else (PauseReason.TOOL_APPROVAL if gated else PauseReason.CHILD_RUNS)
        )
        return StepResult(
            status="waiting",
            wait_until=min(deadlines) if deadlines else None,
            pause_reason=reason,
            pause_details=details,
            awaiting=handed,
        )

    async def _run_tool(
        self, call_round: CommittedRound, index: int, call: ToolCall, approved_arguments: Any = None
    ) -> dict[str, Any]:
        key = f"{call_round.step_run_id}:{call_round.round}:{index}"
        ctx = ToolContext(
            idempotency_key=key,
            workflow_run_id=self.ex.run_id,
            workspace_id=self.ex.workspace_id,
            step_run_id=self.ex.step_run_id,
            step_name=self.ex.step_name,
            round=call_round.round,
            call_index=index,
            tool_call_id=call.id,
            run_input=MappingProxyType(self.ex.input),
            state=MappingProxyType(dict(self.state)),
            _steering=self.steering,  # `ctx.goto`, `ctx.transcript`: shared by the round, nothing copied
        )
        timeout_ms = self.tools.timeouts_ms.get(call.name, self.step.tool_timeout_ms)
        arguments = approved_arguments if approved_arguments is not None else call.arguments
        mcp_tool = self.tools.mcp.get(call.name)
        if mcp_tool is not None:  # an MCP server's tool: a source of its own, recorded the same way
            with self._observe.call(call.name, call.id, call_round.round, arguments) as obs:
                outcome = await llm_mcp.call(self.rt, mcp_tool, parse_arguments(arguments)[0], ctx)
                obs.finished(outcome)
            return await self._record(call_round, index, call, outcome)
        with self._observe.call(call.name, call.id, call_round.round, arguments) as obs:
            outcome = await invoke_tool(
                self.rt.tools,
                call.name,
                arguments,
                context=ctx,
                declared_schema=self.tools.declared.get(call.name),
                timeout_s=timeout_ms / 1000,
                max_output_bytes=self.rt.settings.max_tool_output_bytes,
                declared_output_schema=self.tools.output_schemas.get(call.name),
                max_json_depth=self.rt.settings.max_json_depth,
                max_state_bytes=self.rt.settings.max_state_bytes,
            )
            obs.finished(outcome)
        faults = self.rt.faults
        if faults.armed:
            faults.reached("tool_returned", call_round.round, index)
        if outcome.status != "completed":  # `outcome.ok`, inlined
            return await self._record(call_round, index, call, outcome)
        return await self._record(call_round, index, call, outcome, ctx.state_updates, ctx._goto_step)

    async def _record(
        self,
        call_round: CommittedRound,
        index: int,
        call: ToolCall,
        outcome: ToolOutcome,
        state_updates: dict[str, Any] | None = None,
        goto_step: str | None = None,
    ) -> dict[str, Any]:
        if goto_step is not None:
            goto_step = storable_text(goto_step)
            self.steered = True
        await record_outcome(
            self.rt,
            self.ex,
            outcome,
            step_run_id=call_round.step_run_id,
            llm_call_id=call_round.llm_call_id,
            round_no=call_round.round,
            sequence=index,
            tool_call_id=call.id,
            tool_name=call.name,
            idempotency_key=f"{call_round.step_run_id}:{call_round.round}:{index}",
            state_updates=state_updates,
            goto_step=goto_step,
        )
        self.state.update(state_updates or {})
        if self.meter is not None and outcome.error_code != UNCOUNTED_TOOL_ERROR:
            self.meter.tool_calls += 1
        faults = self.rt.faults
        if faults.armed:
            faults.reached("tool_committed", call_round.round, index)
        # As the trace keeps it (a handler may echo a lone surrogate the model sent): the transcript
        # this execution goes on with is the one a resumed one rebuilds, and the SDK can encode it.
        return {"status": outcome.status, "text": storable_text(outcome.result_text), "goto_step": goto_step}
