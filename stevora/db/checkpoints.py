"""The tool loop's checkpoints: one statement, one round trip, one transaction each.

Each write is a data-modifying CTE that (1) bumps the run's event sequence *fenced by the lease*
(`lease_owner = me AND status = 'RUNNING'`), (2) inserts the trace row, (3) inserts its event.
If the fence fails nothing is written and the caller gets LeaseLost; if the trace row already
exists (unique (llm_call_id, sequence)) the whole statement fails, so a sequence number is never
burnt and no event exists without its trace row (or the reverse).

A checkpoint that fails with a lost connection is retried in place (same ids, same event id):
when the connection died during COMMIT the first try may have committed, and the retry then
hits the unique key (`llm_calls.id`, or `tool_trace (llm_call_id, sequence)`) instead of writing
twice. A unique violation on a *retry* therefore means "already recorded" and the loop goes on;
on a first try it is still an error. Only the fenced holder of the lease can reach the insert,
so the row found is this worker's own earlier write.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg

from stevora.db.transient import Retrier
from stevora.errors import LeaseLost
from stevora.ids import new_id

_ALREADY_RECORDED: Any = object()  # a retry found the statement's rows written by the try before

_LLM_CALL_SQL = """
WITH r AS (
    UPDATE workflow_runs
       SET event_seq = event_seq + 1,
           -- The cast types $17 as a float: `$17 * 100` alone makes PostgreSQL infer int4, and
           -- asyncpg then truncates 0.00045 to 0, so every cost would be stored as 0.
           total_cost_cents = total_cost_cents + $17::double precision * 100,
           total_input_tokens = total_input_tokens + $13,
           total_output_tokens = total_output_tokens + $14
     WHERE id = $1 AND lease_owner = $2 AND status = 'RUNNING'
 RETURNING event_seq
), c AS (
    INSERT INTO llm_calls (id, workflow_run_id, step_run_id, step_name, round, provider, model, status,
                           request, response, error, finish_reason, input_tokens, output_tokens,
                           cache_read_tokens, cache_write_tokens, cost_usd, duration_ms, time_to_first_token_ms)
    SELECT $3, $1, $4, $5, $6, $7, $8, $9, $10, $11, $12, $18, $13, $14, $15, $16, $17, $19, $23 FROM r
    RETURNING id
)
INSERT INTO workflow_events (id, workflow_run_id, step_run_id, sequence, event_type, payload)
SELECT $20, $1, $4, r.event_seq, $21, $22 FROM r, c
RETURNING created_at
"""

_TOOL_TRACE_SQL = """
WITH r AS (
    -- A tool's `ctx.update_state(...)` lands in the same statement as its trace row: never twice,
    -- never for a call that is not recorded as completed.
    UPDATE workflow_runs SET event_seq = event_seq + 1,
           state = CASE WHEN $21::jsonb IS NULL THEN state ELSE COALESCE(state, '{}'::jsonb) || $21::jsonb END
     WHERE id = $1 AND lease_owner = $2 AND status = 'RUNNING'
 RETURNING event_seq
), t AS (
    INSERT INTO tool_trace (id, workflow_run_id, step_run_id, llm_call_id, round, sequence, tool_call_id,
                            tool_name, input_json, output_json, status, error, error_code, result_text,
                            duration_ms, idempotency_key)
    SELECT $3, $1, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17 FROM r
    RETURNING id
)
INSERT INTO workflow_events (id, workflow_run_id, step_run_id, sequence, event_type, payload)
SELECT $18, $1, $4, r.event_seq, $19, $20 FROM r, t
RETURNING sequence
"""


@dataclass(slots=True)
class LlmCallRecord:
    step_run_id: str
    step_name: str
    round: int
    provider: str | None
    model: str
    status: str  # completed | failed
    request: dict[str, Any]
    duration_ms: float
    response: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    finish_reason: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost_usd: float = 0.0
    time_to_first_token_ms: float | None = None  # streamed calls only
    id: str = field(default_factory=lambda: new_id("llm"))


@dataclass(slots=True)
class ToolTraceRecord:
    step_run_id: str
    llm_call_id: str | None  # None for a `tool` step's call
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
    child_run_id: str | None = None
    id: str = field(default_factory=lambda: new_id("tt"))


async def _write_once(pool: asyncpg.Pool, sql: str, args: tuple[Any, ...], what: str, run_id: str) -> Any:
    """Run a checkpoint statement, retrying lost connections; see the module docstring. Returns
    the statement's value, None when the lease fence failed, or `_ALREADY_RECORDED`."""
    retrier = Retrier(what, workflow_run_id=run_id)
    while True:
        try:
            return await pool.fetchval(sql, *args)
        except asyncpg.UniqueViolationError:
            if retrier.failures == 0:
                raise
            return _ALREADY_RECORDED  # the try whose outcome was unknown did commit
        except Exception as exc:
            await retrier.pause(exc)


async def record_llm_call(
    pool: asyncpg.Pool, run_id: str, owner: str, rec: LlmCallRecord, event_type: str, payload: dict[str, Any]
) -> datetime:
    """Commit the call's row and event; returns the commit's timestamp (the row's `created_at`)."""
    args = (
        run_id, owner, rec.id, rec.step_run_id, rec.step_name, rec.round, rec.provider, rec.model, rec.status,
        rec.request, rec.response, rec.error, rec.input_tokens, rec.output_tokens, rec.cache_read_tokens,
        rec.cache_write_tokens, rec.cost_usd, rec.finish_reason, rec.duration_ms,
        new_id("evt"), event_type, payload, rec.time_to_first_token_ms,
    )  # fmt: skip
    committed_at = await _write_once(pool, _LLM_CALL_SQL, args, "record_llm_call", run_id)
    if committed_at is _ALREADY_RECORDED:
        committed_at = await pool.fetchval("SELECT created_at FROM llm_calls WHERE id = $1", rec.id)
    if committed_at is None:
        raise LeaseLost(f"run {run_id}: lease lost before recording LLM call round {rec.round}")
    return committed_at  # type: ignore[no-any-return]


async def record_tool_trace(
    pool: asyncpg.Pool,
    run_id: str,
    owner: str,
    rec: ToolTraceRecord,
    event_type: str,
    payload: dict[str, Any],
    state_updates: dict[str, Any] | None = None,
) -> None:
    args = (
        run_id, owner, rec.id, rec.step_run_id, rec.llm_call_id, rec.round, rec.sequence, rec.tool_call_id,
        rec.tool_name, rec.input_json, rec.output_json, rec.status, rec.error, rec.error_code, rec.result_text,
        rec.duration_ms, rec.idempotency_key, new_id("evt"), event_type, payload, state_updates or None,
    )  # fmt: skip
    seq = await _write_once(pool, _TOOL_TRACE_SQL, args, "record_tool_trace", run_id)
    if seq is None:
        raise LeaseLost(f"run {run_id}: lease lost before recording tool call {rec.idempotency_key}")


async def tool_step_trace(pool: asyncpg.Pool, step_run_id: str) -> asyncpg.Record | None:
    """The trace of a `tool` step run's call, if it was committed (a resumed step reuses it)."""
    return await pool.fetchrow(
        "SELECT status, output_json, error, error_code FROM tool_trace WHERE step_run_id = $1 AND llm_call_id IS NULL",
        step_run_id,
    )


async def insert_tool_traces(conn: asyncpg.Connection, run_id: str, records: list[ToolTraceRecord]) -> None:
    """Trace rows of calls answered from outside the loop, in the caller's transaction (which also
    writes their events and holds the run's row lock). The unique (llm_call_id, sequence) key makes
    a second answer for the same call fail the whole transaction instead of duplicating it."""
    await conn.executemany(
        "INSERT INTO tool_trace (id, workflow_run_id, step_run_id, llm_call_id, round, sequence, tool_call_id, "
        "tool_name, input_json, output_json, status, error, error_code, result_text, duration_ms, "
        "idempotency_key, child_run_id) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, "
        "$15, $16, $17)",
        [
            (
                r.id, run_id, r.step_run_id, r.llm_call_id, r.round, r.sequence, r.tool_call_id, r.tool_name,
                r.input_json, r.output_json, r.status, r.error, r.error_code, r.result_text, r.duration_ms,
                r.idempotency_key, r.child_run_id,
            )
            for r in records
        ],
    )  # fmt: skip


@dataclass(slots=True)
class CommittedRound:
    """A completed model call of this step visit and the tool results committed for it."""

    llm_call_id: str
    step_run_id: str
    round: int
    model: str
    provider: str | None
    request: dict[str, Any]
    response: dict[str, Any]
    cost_usd: float
    input_tokens: int
    output_tokens: int
    tool_results: dict[int, asyncpg.Record]  # sequence → tool_trace row
    committed_at: datetime


async def load_rounds(pool: asyncpg.Pool, run_id: str, step_name: str, visit: int) -> list[CommittedRound]:
    """Every committed round of this step visit, across its attempts, oldest first."""
    calls = await pool.fetch(
        "SELECT c.id, c.step_run_id, c.round, c.model, c.provider, c.request, c.response, c.cost_usd, "
        "c.input_tokens, c.output_tokens, c.created_at "
        "FROM llm_calls c JOIN step_runs s ON s.id = c.step_run_id "
        "WHERE s.workflow_run_id = $1 AND s.step_name = $2 AND s.visit = $3 AND c.status = 'completed' "
        "ORDER BY c.round, c.created_at",
        run_id,
        step_name,
        visit,
    )
    if not calls:
        return []
    traces = await pool.fetch(
        "SELECT llm_call_id, sequence, tool_call_id, tool_name, status, output_json, result_text "
        "FROM tool_trace WHERE llm_call_id = ANY($1::text[])",
        [c["id"] for c in calls],
    )
    by_call: dict[str, dict[int, asyncpg.Record]] = {}
    for t in traces:
        by_call.setdefault(t["llm_call_id"], {})[t["sequence"]] = t
    return [
        CommittedRound(
            llm_call_id=c["id"],
            step_run_id=c["step_run_id"],
            round=c["round"],
            model=c["model"],
            provider=c["provider"],
            request=c["request"],
            response=c["response"],
            cost_usd=c["cost_usd"],
            input_tokens=c["input_tokens"],
            output_tokens=c["output_tokens"],
            tool_results=by_call.get(c["id"], {}),
            committed_at=c["created_at"],
        )
        for c in calls
    ]


def replay_result_text(trace: asyncpg.Record) -> str:
    """The tool message a committed trace stands for, rebuilt for the transcript."""
    if trace["status"] != "completed":
        return str(trace["result_text"] or json.dumps({"error": "Tool call failed"}))
    output = trace["output_json"]
    return output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)


async def guardrail_failure_recorded(conn: asyncpg.Connection, step_run_id: str, round_: int) -> bool:
    """Whether this step run's GUARDRAIL_FAILED event for `round_` is already written.

    Called in the transaction that would write it, by the lease holder: a run resumed after a
    crash between that commit and the step's end re-checks the same final answer, and must not
    announce the same violation twice. (The lease fence on the run row makes check-then-insert
    safe: a previous holder can no longer write.)"""
    found = await conn.fetchval(
        "SELECT 1 FROM workflow_events WHERE step_run_id = $1 AND event_type = 'GUARDRAIL_FAILED' "
        "AND (payload->>'round')::int = $2 LIMIT 1",
        step_run_id,
        round_,
    )
    return found is not None
