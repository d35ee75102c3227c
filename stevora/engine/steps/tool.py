"""`tool`: runs one registered tool deterministically, no model.

    {"type": "tool", "name": "fetch-customer", "tool": "get_customer_data",
     "input": {"customerId": "{{input.customerId}}", "plan": "{{steps.research.output.plan}}"},
     "outputKey": "customer"}

The input is templated (`stevora.templating.render_typed`) and checked against the tool's schema
before it runs. The call is traced like any tool call — a `tool_trace` row with no model call and
its event in one statement, `ctx.update_state(...)` merged in that same statement — under the key
`<stepRunId>:tool`, so a crash never records it twice and a resumed step reuses the record. The
result goes to `state[outputKey]` (default: the step name); a failure fails the step under its
RetryPolicy. An approval-gated tool waits for its decision first, holding no worker. The call
counts against the run's `maxToolCalls` (stevora.engine.budget), checked just before it runs.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from stevora.db import awaited as db_awaited
from stevora.db import checkpoints, runs
from stevora.db.awaited import NewAwaitedCall
from stevora.definitions import ToolStep
from stevora.engine import budget as budget_rules
from stevora.engine.budget import Meter
from stevora.engine.steps import llm_mcp
from stevora.engine.steps.awaited_kinds import AWAITED_KINDS
from stevora.engine.steps.base import StepExecution, StepType, WaitContext, WaitPlan
from stevora.engine.steps.tool_calls import CallSlot, output_limits, record_outcome
from stevora.engine.store import WorkspaceStore
from stevora.observability import hooks as observe
from stevora.statuses import AwaitedKind, AwaitedStatus
from stevora.tasks import StepResult
from stevora.templating import MissingTemplatePath, render_typed
from stevora.tools import ToolContext, ToolOutcome, invoke_tool, schema_problems

if TYPE_CHECKING:
    from stevora.runtime import Runtime

# Failures a retry cannot fix: the definition or a person said no.
_PERMANENT = frozenset(
    {
        "TOOL_NOT_REGISTERED",
        "INVALID_ARGUMENTS",
        "APPROVAL_REJECTED",
        "TOOL_OUTPUT_INVALID",
        "STATE_TOO_LARGE",
    }
)


def _slot(ex: StepExecution, step: ToolStep) -> CallSlot:
    return CallSlot(ex.step_run_id, None, 0, 0, f"step:{step.name}", step.tool)


def _context(rt: Runtime, ex: StepExecution, step: ToolStep, slot: CallSlot) -> ToolContext:
    return ToolContext(
        idempotency_key=slot.key,
        workflow_run_id=ex.run_id,
        workspace_id=ex.workspace_id,
        step_run_id=ex.step_run_id,
        step_name=ex.step_name,
        round=0,
        call_index=0,
        tool_call_id=f"step:{step.name}",
        run_input=MappingProxyType(ex.input),
        state=MappingProxyType(dict(ex.state)),
        _store_backend=WorkspaceStore(rt.pool, ex.workspace_id),
    )


def _failed(code: str, message: str, retryable: bool = False) -> StepResult:
    return StepResult(status="failed", error={"code": code, "message": message}, retryable=retryable)


class ToolStepType(StepType):
    name = "tool"

    async def execute(self, rt: Runtime, ex: StepExecution, step: ToolStep) -> StepResult:
        recorded = await checkpoints.tool_step_trace(rt.pool, ex.step_run_id)
        if recorded is not None:  # committed before a crash, or answered by a rejection
            return self._result(step, recorded["status"] == "completed", recorded)
        registered = rt.tools.get(step.tool)
        mcp_tool = None
        if registered is None:  # an MCP server's tool, `<server>_<tool>` (docs/mcp.md)?
            mcp_tool = await llm_mcp.find_tool(
                rt, run_id=ex.run_id, workspace_id=ex.workspace_id, step_name=ex.step_name, name=step.tool
            )
            if mcp_tool is None:
                return _failed(
                    "TOOL_NOT_REGISTERED",
                    f"Tool '{step.tool}' is not registered in this worker nor an MCP server's tool: "
                    f"register it with `@tool` or `register_tool({step.tool!r}, fn)` in a module loaded "
                    "with `stevora worker --tools MODULE`",
                )
        steps = await runs.completed_step_outputs(rt.pool, ex.run_id)
        try:
            arguments = render_typed(step.input, input=ex.input, state=ex.state, steps=steps)
        except MissingTemplatePath as exc:
            return _failed("TEMPLATE_PATH_MISSING", str(exc))
        if mcp_tool is not None:
            return await self._call_mcp(rt, ex, step, mcp_tool, arguments)
        assert registered is not None
        problems = schema_problems(registered.parameters, arguments)
        if problems:
            return _failed(
                "INVALID_ARGUMENTS",
                f"Input of tool '{step.tool}' does not match its schema: {'; '.join(problems)}",
            )
        gate = AWAITED_KINDS.gating(None, registered)
        if gate is not None:
            decision = [
                row
                for row in await db_awaited.for_step_run(rt.pool, [ex.step_run_id])
                if row["status"] == AwaitedStatus.APPROVED
            ]
            if not decision:
                return self._wait_for(gate, ex, step, arguments, registered.parameters)
            arguments = decision[0]["approved_arguments"]
        if ex.budget is not None:
            meter = await Meter.read(rt.pool, ex.run_id)
            if meter is not None and meter.tool_calls_left() == 0:
                return budget_rules.stopped(meter, "maxToolCalls", ex.step_name)
        return await self._call(rt, ex, step, arguments)

    def _wait_for(
        self,
        gate: AwaitedKind,
        ex: StepExecution,
        step: ToolStep,
        arguments: dict[str, Any],
        parameters: dict[str, Any],
    ) -> StepResult:
        call = NewAwaitedCall(
            llm_call_id=None,
            step_run_id=ex.step_run_id,
            round=0,
            sequence=0,
            tool_call_id=f"step:{step.name}",
            tool_name=step.tool,
            arguments=arguments,
            kind=gate,
            parameters=dict(parameters),
        )
        return AWAITED_KINDS.waiting([call], {})

    async def on_waiting(self, wait: WaitContext, result: StepResult) -> WaitPlan:
        return await AWAITED_KINDS.hand_over(wait, result)

    async def _call(
        self, rt: Runtime, ex: StepExecution, step: ToolStep, arguments: dict[str, Any]
    ) -> StepResult:
        slot = _slot(ex, step)
        ctx = _context(rt, ex, step, slot)
        with observe.tool_call(step.tool, None, ex.step_run_id, None, arguments) as obs:
            outcome = await invoke_tool(
                rt.tools,
                step.tool,
                arguments,
                context=ctx,
                timeout_s=None,
                limits=output_limits(rt.settings),
            )
            obs.finished(outcome)
        return await self._commit(
            rt, ex, step, slot, outcome, ctx.state_updates if outcome.ok else None, ctx.store_writes
        )

    async def _call_mcp(
        self, rt: Runtime, ex: StepExecution, step: ToolStep, tool: llm_mcp.McpTool, arguments: Any
    ) -> StepResult:
        if ex.budget is not None:
            meter = await Meter.read(rt.pool, ex.run_id)
            if meter is not None and meter.tool_calls_left() == 0:
                return budget_rules.stopped(meter, "maxToolCalls", ex.step_name)
        slot = _slot(ex, step)
        ctx = _context(rt, ex, step, slot)
        with observe.tool_call(step.tool, None, ex.step_run_id, None, arguments) as obs:
            outcome = await llm_mcp.call(rt, tool, arguments if isinstance(arguments, dict) else {}, ctx)
            obs.finished(outcome)
        return await self._commit(rt, ex, step, slot, outcome, None)

    async def _commit(
        self,
        rt: Runtime,
        ex: StepExecution,
        step: ToolStep,
        slot: CallSlot,
        outcome: ToolOutcome,
        updates: dict[str, Any] | None,
        store_writes: list[tuple[str, str, dict[str, Any] | None]] | None = None,
    ) -> StepResult:
        rt.faults.reached("tool_returned", 0, 0)
        await record_outcome(rt, ex, slot, outcome, state_updates=updates, store_writes=store_writes)
        rt.faults.reached("tool_committed", 0, 0)
        return self._result(
            step,
            outcome.ok,
            {"output_json": outcome.output, "error": outcome.error, "error_code": outcome.error_code},
        )

    def _result(self, step: ToolStep, ok: bool, recorded: Any) -> StepResult:
        if not ok:
            code = recorded["error_code"] or "TOOL_ERROR"
            return _failed(code, recorded["error"] or "Tool call failed", retryable=code not in _PERMANENT)
        output = recorded["output_json"]
        return StepResult(
            output=output if isinstance(output, dict) else {"result": output},
            state_updates={step.effective_output_key(): output},
        )
