"""Event types and webhook event names: the catalogue written by the engine and read by the API,
UI and client, plus the builders for payloads written in more than one place.

Events are rows of `workflow_events`, written in the same transaction as the change they record,
with a gap-free per-run `sequence` (see stevora.db.runs).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

# Ephemeral, never stored: a streamed model call's text as it arrives. The worker publishes it with
# PostgreSQL NOTIFY on this channel; the API and UI event streams send it under this SSE event name
# with no `id:` line, so resuming with Last-Event-ID (stored events only) is unaffected.
LLM_TEXT_CHANNEL = "stevora_llm_text"
LLM_TEXT_DELTA = "llm.text.delta"
# A long MCP tool call's progress notifications, on the same channel and as ephemeral (docs/mcp.md).
TOOL_PROGRESS = "tool.progress"


class EventType(StrEnum):
    WORKFLOW_STARTED = "WORKFLOW_STARTED"
    WORKFLOW_PAUSED = "WORKFLOW_PAUSED"
    WORKFLOW_RESUMED = "WORKFLOW_RESUMED"
    WORKFLOW_COMPLETED = "WORKFLOW_COMPLETED"
    WORKFLOW_FAILED = "WORKFLOW_FAILED"
    WORKFLOW_CANCELLED = "WORKFLOW_CANCELLED"
    STEP_STARTED = "STEP_STARTED"
    STEP_COMPLETED = "STEP_COMPLETED"
    STEP_FAILED = "STEP_FAILED"
    STEP_RETRYING = "STEP_RETRYING"
    STEP_SKIPPED = "STEP_SKIPPED"
    LLM_CALL_COMPLETED = "LLM_CALL_COMPLETED"
    LLM_CALL_FAILED = "LLM_CALL_FAILED"
    TOOL_CALL_COMPLETED = "TOOL_CALL_COMPLETED"
    TOOL_CALL_FAILED = "TOOL_CALL_FAILED"
    GUARDRAIL_FAILED = "GUARDRAIL_FAILED"
    APPROVAL_REQUESTED = "APPROVAL_REQUESTED"
    APPROVAL_DECIDED = "APPROVAL_DECIDED"
    BUDGET_UPDATED = "BUDGET_UPDATED"
    WORKFLOW_FORKED = "WORKFLOW_FORKED"  # on a fork (its origin) and on the origin (the fork)
    MAP_ITEM_STARTED = "MAP_ITEM_STARTED"  # a `map` step started an item's child run
    MAP_ITEM_COMPLETED = "MAP_ITEM_COMPLETED"  # ... whose child run completed
    MAP_ITEM_FAILED = "MAP_ITEM_FAILED"  # ... whose child run failed or was cancelled
    CONTEXT_COMPACTED = "CONTEXT_COMPACTED"  # an llm step's `compact` summary call was committed
    MESSAGE_INJECTED = "MESSAGE_INJECTED"  # a message sent to the run went into an llm step's round


# Events after which a run has ended (the UI stream and the client's watch stop on them).
TERMINAL_EVENT_TYPES: frozenset[EventType] = frozenset(
    {EventType.WORKFLOW_COMPLETED, EventType.WORKFLOW_FAILED, EventType.WORKFLOW_CANCELLED}
)


class WebhookEvent(StrEnum):
    WORKFLOW_COMPLETED = "workflow.completed"
    WORKFLOW_FAILED = "workflow.failed"
    WORKFLOW_CANCELLED = "workflow.cancelled"
    WORKFLOW_TOOL_OUTPUTS_REQUIRED = "workflow.tool_outputs_required"
    APPROVAL_REQUESTED = "approval.requested"
    APPROVAL_DECIDED = "approval.decided"
    WORKFLOW_FORKED = "workflow.forked"  # a fork or replay was made (its run id, the origin's)


@dataclass(frozen=True, slots=True)
class Event:
    event_type: EventType
    payload: dict[str, Any]
    step_run_id: str | None = None


def duration_ms(started: datetime | None, ended: datetime | None) -> int:
    return max(0, int((ended - started).total_seconds() * 1000)) if started and ended else 0


def step_completed(step: Any) -> Event:
    """`STEP_COMPLETED` for a step row just moved to COMPLETED (its started/completed times set)."""
    return Event(
        EventType.STEP_COMPLETED,
        {"stepName": step["step_name"], "durationMs": duration_ms(step["started_at"], step["completed_at"])},
        step["id"],
    )


def step_failed(step: Any, error: dict[str, Any]) -> Event:
    return Event(
        EventType.STEP_FAILED,
        {"stepName": step["step_name"], "attempt": step["attempt"], "error": error},
        step["id"],
    )
