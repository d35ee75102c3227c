"""Recording a tool call the worker ran itself (an `llm` step's handler call, a `tool` step's call):
its `tool_trace` row, its `TOOL_CALL_*` event and its state updates in one lease-fenced statement."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stevora.db import checkpoints
from stevora.db.checkpoints import ToolTraceRecord
from stevora.db.database import storable_text
from stevora.engine.steps.base import StepExecution
from stevora.events import EventType
from stevora.tools import ToolOutcome

if TYPE_CHECKING:
    from stevora.runtime import Runtime

# The widths of `tool_trace.tool_name` / `tool_call_id` (and `awaited_tool_calls`'). A model may
# name a tool or a call with anything (no offered tool has a longer name or any other character
# than [A-Za-z0-9_-]: such a call is refused as TOOL_NOT_OFFERED), and its trace must still be
# written: the rest past the width is cut, never the trace.
TOOL_NAME_WIDTH = 64
TOOL_CALL_ID_WIDTH = 200


def column_text(value: str, width: int) -> str:
    """`value` as a text column holds it: at most `width` characters, the NUL character and lone
    surrogates (which PostgreSQL text cannot hold) replaced by U+FFFD."""
    return storable_text(value[:width])


async def record_outcome(
    rt: Runtime,
    ex: StepExecution,
    outcome: ToolOutcome,
    *,
    step_run_id: str,
    llm_call_id: str | None,
    round_no: int,
    sequence: int,
    tool_call_id: str,
    tool_name: str,
    idempotency_key: str,
    state_updates: dict[str, Any] | None,
    goto_step: str | None = None,
) -> None:
    tool_name = column_text(tool_name, TOOL_NAME_WIDTH)
    tool_call_id = column_text(tool_call_id, TOOL_CALL_ID_WIDTH)
    ok = outcome.status == "completed"  # `outcome.ok`, read once
    rec = ToolTraceRecord(
        step_run_id=step_run_id,
        llm_call_id=llm_call_id,
        round=round_no,
        sequence=sequence,
        tool_call_id=tool_call_id,
        tool_name=tool_name,
        input_json=outcome.input,
        output_json=outcome.output,
        status=outcome.status,
        error=outcome.error,
        error_code=outcome.error_code,
        result_text=None if ok else outcome.result_text,
        duration_ms=outcome.duration_ms,
        idempotency_key=idempotency_key,
        goto_step=goto_step,
    )
    payload: dict[str, Any] = {
        "toolTraceId": rec.id,
        "llmCallId": llm_call_id,
        "toolName": tool_name,
        "toolCallId": tool_call_id,
        "round": round_no,
        "sequence": sequence,
        "durationMs": round(outcome.duration_ms, 3),
    }
    if not ok:
        payload.update(error=outcome.error, errorCode=outcome.error_code)
    if state_updates:
        payload["stateKeys"] = sorted(state_updates)
    if goto_step is not None:
        payload["gotoStep"] = goto_step
    event = EventType.TOOL_CALL_COMPLETED if ok else EventType.TOOL_CALL_FAILED
    await checkpoints.record_tool_trace(rt.committer, ex.run_id, ex.owner, rec, event, payload, state_updates)
