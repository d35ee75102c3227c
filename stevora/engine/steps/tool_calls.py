"""A tool call's trace: its idempotency key, its `TOOL_CALL_*` event, and recording a call the
worker ran itself (an `llm` step's handler call, a `tool` step's call): its `tool_trace` row, its
event and its state updates in one lease-fenced statement.

The key and the event payload are built here only: calls answered from outside the loop
(stevora.engine.steps.awaited) write theirs through the same two functions."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stevora.db import blobs, checkpoints
from stevora.db.checkpoints import ToolTraceRecord
from stevora.db.database import storable_text
from stevora.engine.steps.base import StepExecution
from stevora.events import EventType
from stevora.tools import OutputLimits, ToolErrorCode, ToolOutcome

if TYPE_CHECKING:
    from stevora.runtime import Runtime
    from stevora.settings import Settings

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


def tool_call_key(step_run_id: str, llm_call_id: str | None, round_no: int, sequence: int) -> str:
    """The key a handler gets for a call (`ToolContext.idempotency_key`, `tool_trace.idempotency_key`):
    `<stepRunId>:<round>:<index>` in an `llm` step, `<stepRunId>:tool` for a `tool` step's call
    (no model call)."""
    if llm_call_id is None:
        return f"{step_run_id}:tool"
    return f"{step_run_id}:{round_no}:{sequence}"


def row_key(call: Mapping[str, Any]) -> str:
    """`tool_call_key` of an `awaited_tool_calls` row."""
    return tool_call_key(call["step_run_id"], call["llm_call_id"], call["round"], call["sequence"])


def output_limits(settings: Settings) -> OutputLimits:
    """What a handler's result may be in this deployment (`STEVORA_MAX_TOOL_OUTPUT_BYTES`,
    `STEVORA_MAX_JSON_DEPTH`, `STEVORA_MAX_STATE_BYTES`)."""
    return OutputLimits(
        settings.max_tool_output_bytes,
        settings.max_json_depth,
        settings.max_state_bytes,
        max_attachment_bytes=settings.max_attachment_bytes,
    )


def failed_call(arguments: dict[str, Any], code: ToolErrorCode, error: str) -> ToolOutcome:
    """A call refused before it ran or was handed over: the model gets `{"error": error}`."""
    return ToolOutcome(
        status="failed",
        input=arguments,
        output=None,
        error=error,
        error_code=code,
        duration_ms=0.0,
        result_text=json.dumps({"error": error}, ensure_ascii=False),
    )


@dataclass(frozen=True, slots=True)
class CallSlot:
    """Where a tool call sits: its step run, model call (None: a `tool` step's), round and index
    in the round, and the model's id and tool name for it."""

    step_run_id: str
    llm_call_id: str | None
    round: int
    sequence: int
    tool_call_id: str
    tool_name: str
    key: str = field(init=False)  # its `tool_call_key`, made once (read by the handler and the trace)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "key", tool_call_key(self.step_run_id, self.llm_call_id, self.round, self.sequence)
        )


def tool_call_event(
    rec: ToolTraceRecord,
    *,
    answered_by: str | None = None,
    state_keys: list[str] | None = None,
) -> tuple[EventType, dict[str, Any]]:
    """The `TOOL_CALL_COMPLETED` / `TOOL_CALL_FAILED` event of a trace row, and its payload."""
    ok = rec.status == "completed"
    payload: dict[str, Any] = {
        "toolTraceId": rec.id,
        "llmCallId": rec.llm_call_id,
        "toolName": rec.tool_name,
        "toolCallId": rec.tool_call_id,
        "round": rec.round,
        "sequence": rec.sequence,
        "durationMs": round(rec.duration_ms, 3),
    }
    if answered_by is not None:
        payload["answeredBy"] = answered_by
    if rec.child_run_id is not None:
        payload["childRunId"] = rec.child_run_id
    if not ok:
        payload.update(error=rec.error, errorCode=rec.error_code)
    if state_keys:
        payload["stateKeys"] = state_keys
    if rec.goto_step is not None:
        payload["gotoStep"] = rec.goto_step
    return (EventType.TOOL_CALL_COMPLETED if ok else EventType.TOOL_CALL_FAILED), payload


async def record_outcome(
    rt: Runtime,
    ex: StepExecution,
    slot: CallSlot,
    outcome: ToolOutcome,
    *,
    state_updates: dict[str, Any] | None = None,
    goto_step: str | None = None,
    store_writes: list[tuple[str, str, dict[str, Any] | None]] | None = None,
) -> None:
    """Commit the call's trace row, its event and its `update_state`, fenced by the lease (and
    its memory-store writes, when it completed and made some, in the same transaction). The
    images and files of its result are stored first (once per workspace): the trace names them."""
    ok = outcome.status == "completed"  # `outcome.ok`, read once
    if outcome.attachments:
        await blobs.store(rt.pool, ex.workspace_id, outcome.attachments)
    rec = ToolTraceRecord(
        step_run_id=slot.step_run_id,
        llm_call_id=slot.llm_call_id,
        round=slot.round,
        sequence=slot.sequence,
        tool_call_id=column_text(slot.tool_call_id, TOOL_CALL_ID_WIDTH),
        tool_name=column_text(slot.tool_name, TOOL_NAME_WIDTH),
        input_json=outcome.input,
        output_json=outcome.output,
        status=outcome.status,
        error=outcome.error,
        error_code=outcome.error_code,
        result_text=None if ok else outcome.result_text,
        duration_ms=outcome.duration_ms,
        idempotency_key=slot.key,
        goto_step=goto_step,
    )
    event, payload = tool_call_event(rec, state_keys=sorted(state_updates) if state_updates else None)
    if store_writes and ok:
        await checkpoints.record_tool_trace_and_store(
            rt.pool,
            ex.run_id,
            ex.owner,
            rec,
            event,
            payload,
            state_updates,
            ex.workspace_id,
            store_writes,
            ex.inbox,
        )
        return
    await checkpoints.record_tool_trace(
        rt.committer, ex.run_id, ex.owner, rec, event, payload, state_updates, ex.inbox
    )
