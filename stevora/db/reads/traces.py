"""A run's model calls (`llm_calls`) and tool calls (`tool_trace`): the API's trace routes, the UI's
run page and diff view read them here."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar

from stevora.db.reads.rows import Reader, Row, fetch


@dataclass(frozen=True, slots=True)
class LlmCallRow(Row):
    """An `llm_calls` row, every column."""

    table: ClassVar[str] = "llm_calls"

    id: str
    workflow_run_id: str
    step_run_id: str
    step_name: str
    round: int
    provider: str | None
    model: str
    status: str
    request: dict[str, Any]
    response: dict[str, Any] | None
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    cost_usd: float
    duration_ms: float
    time_to_first_token_ms: float | None
    finish_reason: str | None
    error: dict[str, Any] | None
    inherited_from: str | None
    created_at: datetime
    reasoning_tokens: int


@dataclass(frozen=True, slots=True)
class ToolTraceRow(Row):
    """A `tool_trace` row, every column."""

    table: ClassVar[str] = "tool_trace"
    table_alias: ClassVar[str] = "t"

    id: str
    workflow_run_id: str
    step_run_id: str
    llm_call_id: str | None
    round: int
    sequence: int
    tool_call_id: str
    tool_name: str
    input_json: Any
    output_json: Any
    status: str
    error: str | None
    error_code: str | None
    result_text: str | None
    duration_ms: float
    idempotency_key: str
    child_run_id: str | None
    state_updates: dict[str, Any] | None
    goto_step: str | None
    inherited_from: str | None
    created_at: datetime


_CALLS = f"SELECT {LlmCallRow.columns()} FROM llm_calls WHERE workflow_run_id = $1"


async def calls(db: Reader, run_id: str, step_name: str | None = None) -> list[LlmCallRow]:
    """The run's model calls (completed and failed; of one step when named), oldest first."""
    if step_name is None:
        rows = await fetch(db, f"{_CALLS} ORDER BY created_at, round, id", run_id)
    else:
        rows = await fetch(
            db, f"{_CALLS} AND step_name = $2 ORDER BY created_at, round, id", run_id, step_name
        )
    return LlmCallRow.all(rows)


async def calls_by_round(db: Reader, run_id: str) -> list[LlmCallRow]:
    return LlmCallRow.all(await fetch(db, f"{_CALLS} ORDER BY round, created_at", run_id))


_TRACES = (
    f"SELECT {ToolTraceRow.columns()} FROM tool_trace t LEFT JOIN llm_calls c ON c.id = t.llm_call_id "
    "WHERE t.workflow_run_id = $1"
)
# Rounds in the order their model calls were made, then calls in the order of the model's answer
# (`sequence`): parallel calls finish (and are committed) in any order. A `tool` step's call has no
# model call: it sorts by its own commit time.
_CALL_ORDER = "ORDER BY coalesce(c.created_at, t.created_at), c.id, t.sequence"


async def tool_traces(db: Reader, run_id: str, step_name: str | None = None) -> list[ToolTraceRow]:
    """The run's tool calls (of one step when named), in the order they were asked for."""
    if step_name is None:
        rows = await fetch(db, f"{_TRACES} {_CALL_ORDER}", run_id)
    else:
        rows = await fetch(
            db,
            f"{_TRACES} AND EXISTS (SELECT 1 FROM step_runs s WHERE s.id = t.step_run_id "
            f"AND s.step_name = $2) {_CALL_ORDER}",
            run_id,
            step_name,
        )
    return ToolTraceRow.all(rows)


async def traces_by_round(db: Reader, run_id: str) -> list[ToolTraceRow]:
    rows = await fetch(
        db,
        f"SELECT {ToolTraceRow.columns('')} FROM tool_trace WHERE workflow_run_id = $1 ORDER BY round, sequence",
        run_id,
    )
    return ToolTraceRow.all(rows)
