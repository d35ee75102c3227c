"""The `llm` step's tool calls: which tools the model is offered, and running the calls of a round,
each committed with its event in one statement (`tool_trace` + `TOOL_CALL_*`).

A committed call never runs again; a handler that ran but whose commit did not happen runs again
with the same idempotency key (`<stepRunId>:<round>:<callIndex>`): at-least-once handlers,
exactly-once records.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from stevora.db import checkpoints
from stevora.db.checkpoints import CommittedRound, ToolTraceRecord
from stevora.definitions import LlmStep, LlmToolDef
from stevora.engine.steps.base import StepExecution
from stevora.engine.steps.llm_state import LoopState
from stevora.errors import StevoraError
from stevora.events import EventType
from stevora.llm.messages import Message, ToolCall, ToolSpec
from stevora.tools import ToolContext, invoke_tool

if TYPE_CHECKING:
    from stevora.runtime import Runtime


@dataclass(slots=True)
class StepTools:
    specs: list[ToolSpec]
    declared: dict[str, dict[str, Any]]  # inline schemas, validated against before the handler runs


def resolve_tools(rt: Runtime, step: LlmStep) -> StepTools:
    specs: list[ToolSpec] = []
    declared: dict[str, dict[str, Any]] = {}
    for entry in step.tools:
        if isinstance(entry, LlmToolDef):
            specs.append(ToolSpec(entry.name, entry.description, dict(entry.parameters)))
            declared[entry.name] = dict(entry.parameters)
            continue
        registered = rt.tools.get(entry.name)
        if registered is None:
            raise StevoraError(
                f"Step '{step.name}' references tool '{entry.name}', which is not registered in this worker "
                f"(load its module with `stevora worker --tools MODULE`)",
                code="TOOL_NOT_REGISTERED",
                retryable=False,
            )
        specs.append(ToolSpec(registered.name, registered.description, dict(registered.parameters)))
    return StepTools(specs, declared)


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

    async def run_missing(self, st: LoopState, last: CommittedRound, calls: tuple[ToolCall, ...]) -> None:
        missing = [(i, c) for i, c in enumerate(calls) if i not in last.tool_results]
        if not missing:
            return
        if self.step.parallel_tool_calls and len(missing) > 1:
            results = await asyncio.gather(*(self._run_tool(last, i, c) for i, c in missing))
        else:
            results = [await self._run_tool(last, i, c) for i, c in missing]
        # The model sees results in its own call order, whatever order they finished in.
        by_index = dict(zip((i for i, _ in missing), results, strict=True))
        for index, call in enumerate(calls):
            if index in by_index:
                trace = by_index[index]
                last.tool_results[index] = trace
                st.transcript.append(
                    Message.tool_result(
                        call.id, trace["text"], name=call.name, is_error=trace["status"] != "completed"
                    )
                )

    async def _run_tool(self, call_round: CommittedRound, index: int, call: ToolCall) -> dict[str, Any]:
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
        )
        outcome = await invoke_tool(
            self.rt.tools,
            call.name,
            call.arguments,
            context=ctx,
            declared_schema=self.tools.declared.get(call.name),
            timeout_s=self.step.tool_timeout_ms / 1000,
            max_output_bytes=self.rt.settings.max_tool_output_bytes,
        )
        rec = ToolTraceRecord(
            step_run_id=call_round.step_run_id,
            llm_call_id=call_round.llm_call_id,
            round=call_round.round,
            sequence=index,
            tool_call_id=call.id,
            tool_name=call.name,
            input_json=outcome.input,
            output_json=outcome.output,
            status=outcome.status,
            error=outcome.error,
            error_code=outcome.error_code,
            result_text=None if outcome.ok else outcome.result_text,
            duration_ms=outcome.duration_ms,
            idempotency_key=key,
        )
        payload: dict[str, Any] = {
            "toolTraceId": rec.id,
            "llmCallId": rec.llm_call_id,
            "toolName": call.name,
            "toolCallId": call.id,
            "round": rec.round,
            "sequence": index,
            "durationMs": round(outcome.duration_ms, 3),
        }
        if not outcome.ok:
            payload.update(error=outcome.error, errorCode=outcome.error_code)
        event = EventType.TOOL_CALL_COMPLETED if outcome.ok else EventType.TOOL_CALL_FAILED
        self.rt.faults.reached("tool_returned", rec.round, index)
        await checkpoints.record_tool_trace(self.rt.pool, self.ex.run_id, self.ex.owner, rec, event, payload)
        self.rt.faults.reached("tool_committed", rec.round, index)
        return {"status": outcome.status, "text": outcome.result_text}
