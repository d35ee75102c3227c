"""The tool loop's checkpoints: one statement, one round trip, one transaction each.

Each write is a data-modifying CTE (`checkpoint_sql.py`) that (1) bumps the run's event sequence
*fenced by the lease* (`lease_owner = me AND status = 'RUNNING'`), (2) inserts the trace row,
(3) inserts its event. If the fence fails nothing is written and the caller gets LeaseLost; if
the trace row already exists (unique (llm_call_id, sequence)) the whole statement fails, so a
sequence number is never burnt and no event exists without its trace row (or the reverse).
Concurrent runs' checkpoints share one such statement (`group_commit.py`, owned by the Runtime),
each row fenced by its own lease.

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

from stevora.db import store
from stevora.db.checkpoint_sql import LLM_CALL, TOOL_TRACE, TOOL_TRACE_COLUMNS
from stevora.db.group_commit import ALREADY_RECORDED, GroupCommitter
from stevora.errors import LeaseLost
from stevora.ids import new_id


@dataclass(slots=True)
class Inbox:
    """Whether messages sent to the run (`run_messages`, pending) may wait for its llm step.

    Set from the run's `pending_messages` as each checkpoint statement returns it (and as the
    transition that started the execution did); the step queries `run_messages` at a round
    boundary only when it is set, and clears it once it has (docs/threads.md, "Steering")."""

    pending: bool = True

    def saw(self, row: Any) -> None:
        """A checkpoint's row: raise the flag if the run has messages waiting (never lowers it:
        only the step's own query does, and rows of concurrent tool calls come in any order)."""
        if row is ALREADY_RECORDED or row["pending_messages"]:
            self.pending = True  # a retry's row was not read: look, to be safe


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
    reasoning_tokens: int = 0
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
    state_updates: dict[str, Any] | None = None  # the call's update_state (the state-change log)
    goto_step: str | None = None  # the step its handler went to (`ctx.goto`)
    id: str = field(default_factory=lambda: new_id("tt"))


async def record_llm_call(
    committer: GroupCommitter,
    run_id: str,
    owner: str,
    rec: LlmCallRecord,
    event_type: str,
    payload: dict[str, Any],
    inbox: Inbox | None = None,
) -> datetime:
    """Commit the call's row and event; returns the commit's timestamp (the row's `created_at`).
    `inbox` learns whether messages sent to the run wait for its llm step."""
    # `LLM_CALL.row(...)`, inlined (a call per checkpoint): run, record columns, event.
    values = (run_id, owner, *LLM_CALL.record_values(rec), new_id("evt"), event_type, payload)
    row = await committer.write(LLM_CALL, run_id, values, f"LLM call round {rec.round}")
    if inbox is not None:
        inbox.saw(row)
    if row is ALREADY_RECORDED:
        return await committer.pool.fetchval("SELECT created_at FROM llm_calls WHERE id = $1", rec.id)  # type: ignore[no-any-return]
    return row["created_at"]  # type: ignore[no-any-return]


async def record_tool_trace(
    committer: GroupCommitter,
    run_id: str,
    owner: str,
    rec: ToolTraceRecord,
    event_type: str,
    payload: dict[str, Any],
    state_updates: dict[str, Any] | None = None,
    inbox: Inbox | None = None,
) -> None:
    """Commit the call's trace row and event, and merge `state_updates` into the run's state
    (`inbox`: as for `record_llm_call`)."""
    rec.state_updates = state_updates or None  # the state-change log column (docs/time-travel.md)
    values = (  # `TOOL_TRACE.row(...)`, inlined: run, record columns, event
        run_id,
        owner,
        *TOOL_TRACE.record_values(rec),
        new_id("evt"),
        event_type,
        payload,
    )
    row = await committer.write(TOOL_TRACE, run_id, values, f"tool call {rec.idempotency_key}")
    if inbox is not None:
        inbox.saw(row)


async def record_tool_trace_and_store(
    pool: asyncpg.Pool,
    run_id: str,
    owner: str,
    rec: ToolTraceRecord,
    event_type: str,
    payload: dict[str, Any],
    state_updates: dict[str, Any] | None,
    workspace_id: str,
    writes: list[tuple[str, str, dict[str, Any] | None]],
    inbox: Inbox | None = None,
) -> None:
    """`record_tool_trace` for a call that wrote to the memory store: its writes, trace row, event
    and state in one transaction (the checkpoint's own statement, not a group commit), so a
    call's writes exist exactly when its trace row does."""
    rec.state_updates = state_updates or None
    values = (run_id, owner, *TOOL_TRACE.record_values(rec), new_id("evt"), event_type, payload)
    async with pool.acquire() as conn, conn.transaction():
        await store.apply(conn, workspace_id, writes)
        row = await conn.fetchrow(TOOL_TRACE.single_sql, *values)
        if row is None:
            raise LeaseLost(
                f"run {run_id} is no longer leased by this worker (tool call {rec.idempotency_key})"
            )
    if inbox is not None:
        inbox.saw(row)


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
    await conn.executemany(_INSERT_TOOL_TRACE_SQL, [(run_id, *TOOL_TRACE.record_values(r)) for r in records])


_INSERT_TOOL_TRACE_SQL = "INSERT INTO tool_trace (workflow_run_id, {}) VALUES ({})".format(
    ", ".join(c for c, _ in TOOL_TRACE_COLUMNS),
    ", ".join(f"${n}" for n in range(1, len(TOOL_TRACE_COLUMNS) + 2)),
)


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


_CALL_COLUMNS = (
    "c.id, c.step_run_id, c.round, c.model, c.provider, c.request, c.response, c.cost_usd, "
    "c.input_tokens, c.output_tokens, c.created_at"
)


async def load_rounds(pool: asyncpg.Pool, run_id: str, step_name: str, visit: int) -> list[CommittedRound]:
    """Every committed round of this step visit, across its attempts, oldest first."""
    calls = await pool.fetch(
        f"SELECT {_CALL_COLUMNS} FROM llm_calls c JOIN step_runs s ON s.id = c.step_run_id "
        "WHERE s.workflow_run_id = $1 AND s.step_name = $2 AND s.visit = $3 AND c.status = 'completed' "
        "ORDER BY c.round, c.created_at",
        run_id,
        step_name,
        visit,
    )
    return await _with_traces(pool, calls)


# A thread turn's first model call stores the history it continued as a reference, `historyFrom`
# (the earlier turn's run id): the chain of turns a conversation continues, from `$1` back to the
# first turn (or a turn stored whole), each turn's step `$2`, first visit. Each step of the chain
# is an index lookup by run (`ix_llm_calls_run`); only a conversation step's first visit carries
# a history, so the recursion needs no step run, and the rows read are the first visit's.
_CHAIN_SQL = f"""
WITH RECURSIVE chain(run_id) AS (
    SELECT $1::text
    UNION
    SELECT c.request->>'historyFrom' FROM chain
      JOIN llm_calls c ON c.workflow_run_id = chain.run_id AND c.step_name = $2
     WHERE c.status = 'completed' AND c.request ? 'historyFrom'
)
SELECT c.workflow_run_id, {_CALL_COLUMNS}
  FROM chain JOIN llm_calls c ON c.workflow_run_id = chain.run_id AND c.step_name = $2
  JOIN step_runs s ON s.id = c.step_run_id AND s.visit = 1
 WHERE c.status = 'completed'
 ORDER BY c.workflow_run_id, c.round, c.created_at
"""


async def load_chain(pool: asyncpg.Pool, run_id: str, step_name: str) -> dict[str, list[CommittedRound]]:
    """The committed rounds of `run_id`'s step and of every earlier turn its conversation
    continues (through `historyFrom`), by run: two statements, however many turns."""
    calls = await pool.fetch(_CHAIN_SQL, run_id, step_name)
    by_run: dict[str, list[CommittedRound]] = {}
    rounds = await _with_traces(pool, calls)
    for call, r in zip(calls, rounds, strict=True):
        by_run.setdefault(call["workflow_run_id"], []).append(r)
    return by_run


async def _with_traces(pool: asyncpg.Pool, calls: list[asyncpg.Record]) -> list[CommittedRound]:
    if not calls:
        return []
    traces = await pool.fetch(
        "SELECT llm_call_id, sequence, tool_call_id, tool_name, status, output_json, result_text, goto_step "
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
