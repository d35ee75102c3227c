"""Time travel's rows: the state-change log a run's fork points are recovered from, and the copy
of an origin's history into a fork (docs/time-travel.md).

The log is the rows themselves: each `tool_trace` row carries the `update_state` its call made and
each completed `step_runs` row the state change its completion made, both written in the statement
that changed the run's state. Nothing is stored per round beyond that delta.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from stevora.db.checkpoint_sql import LLM_CALL_COLUMNS, TOOL_TRACE_COLUMNS
from stevora.ids import new_id

FORK_COLUMNS = (
    "id, workspace_id, definition_id, status, input, state, initial_state, forked_from_run_id, "
    "forked_at_step, forked_at_round, fork_edits, replay_of, replay_tools, idempotency_key, trace_context, "
    "created_at"
)


async def history(conn: asyncpg.Connection | asyncpg.Pool, run_id: str) -> dict[str, list[asyncpg.Record]]:
    """A run's step runs, completed model calls and tool traces, each in the order they happened."""
    steps = await conn.fetch(
        "SELECT id, step_name, step_type, step_index, visit, attempt, status, input, output, error, "
        "state_updates, inherited_from, started_at, completed_at, created_at "
        "FROM step_runs WHERE workflow_run_id = $1 ORDER BY created_at, step_index, visit, attempt, id",
        run_id,
    )
    calls = await conn.fetch(
        "SELECT * FROM llm_calls WHERE workflow_run_id = $1 AND status = 'completed' ORDER BY round, created_at",
        run_id,
    )
    traces = await conn.fetch(
        "SELECT * FROM tool_trace WHERE workflow_run_id = $1 ORDER BY round, created_at, sequence", run_id
    )
    return {"steps": list(steps), "calls": list(calls), "traces": list(traces)}


async def get_fork_row(
    conn: asyncpg.Connection | asyncpg.Pool, workspace_id: str, run_id: str
) -> asyncpg.Record | None:
    return await conn.fetchrow(
        f"SELECT {FORK_COLUMNS} FROM workflow_runs WHERE id = $1 AND workspace_id = $2", run_id, workspace_id
    )


async def get_by_key(conn: asyncpg.Connection, workspace_id: str, key: str) -> asyncpg.Record | None:
    return await conn.fetchrow(
        f"SELECT {FORK_COLUMNS} FROM workflow_runs WHERE workspace_id = $1 AND idempotency_key = $2",
        workspace_id,
        key,
    )


async def list_forks(conn: asyncpg.Connection | asyncpg.Pool, run_id: str) -> list[asyncpg.Record]:
    return list(
        await conn.fetch(
            "SELECT id, status, forked_at_step, forked_at_round, replay_of, created_at FROM workflow_runs "
            "WHERE forked_from_run_id = $1 ORDER BY created_at, id",
            run_id,
        )
    )


async def insert_fork_run(
    conn: asyncpg.Connection,
    *,
    origin: asyncpg.Record,
    definition_id: str,
    state: dict[str, Any],
    initial_state: dict[str, Any],
    step_name: str,
    round_: int | None,
    edits: dict[str, Any] | None,
    idempotency_key: str | None,
    replay_tools: str | None,
    replay: bool,
    totals: tuple[float, int, int],
    trace_context: dict[str, str] | None = None,
) -> asyncpg.Record | None:
    """The fork's run row: RUNNING, unleased, due now (the sweep or a dispatch hint picks it up).
    None when the idempotency key is taken."""
    return await conn.fetchrow(
        "INSERT INTO workflow_runs (id, workspace_id, definition_id, status, input, state, initial_state, "
        "idempotency_key, dispatched_at, started_at, depth, budget, forked_from_run_id, forked_at_step, "
        "forked_at_round, fork_edits, replay_of, replay_tools, total_cost_cents, total_input_tokens, "
        "total_output_tokens, current_step_name, trace_context) "
        "VALUES ($1, $2, $3, 'RUNNING', $4, $5, $6, $7, now(), now(), 1, $8, $9, $10, $11, $12, $13, $14, "
        "$15, $16, $17, $10, $18) "
        "ON CONFLICT (workspace_id, idempotency_key) DO NOTHING "
        f"RETURNING {FORK_COLUMNS}",
        new_id("wfrun"),
        origin["workspace_id"],
        definition_id,
        origin["input"],
        state,
        initial_state,
        idempotency_key,
        origin["budget"],
        origin["id"],
        step_name,
        round_,
        edits,
        origin["id"] if replay else None,
        replay_tools,
        *totals,
        trace_context,
    )


async def copy_step_run(
    conn: asyncpg.Connection, fork_id: str, step: asyncpg.Record, *, status: str | None = None
) -> str:
    """A copy of an origin step run (inherited) in the fork; returns its id. With `status` it is
    the forked step's own new run instead (attempt 1, not inherited)."""
    new = new_id("srun")
    if status is None:
        await conn.execute(
            "INSERT INTO step_runs (id, workflow_run_id, step_name, step_type, step_index, visit, attempt, "
            "status, input, output, error, state_updates, inherited_from, started_at, completed_at, created_at) "
            "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)",
            new,
            fork_id,
            step["step_name"],
            step["step_type"],
            step["step_index"],
            step["visit"],
            step["attempt"],
            step["status"],
            step["input"],
            step["output"],
            step["error"],
            step["state_updates"],
            step["id"],
            step["started_at"],
            step["completed_at"],
            step["created_at"],
        )
    else:
        await conn.execute(
            "INSERT INTO step_runs (id, workflow_run_id, step_name, step_type, step_index, visit, attempt, "
            "status, started_at) VALUES ($1, $2, $3, $4, $5, $6, 1, $7::text, "
            "CASE WHEN $7::text = 'RUNNING' THEN now() END)",
            new,
            fork_id,
            step["step_name"],
            step["step_type"],
            step["step_index"],
            step["visit"],
            status,
        )
    return new


_LLM_COLS = [c for c, _ in LLM_CALL_COLUMNS]
_TRACE_COLS = [c for c, _ in TOOL_TRACE_COLUMNS]


async def copy_llm_calls(conn: asyncpg.Connection, fork_id: str, calls: list[dict[str, Any]]) -> None:
    """Insert copies (dicts of the origin's columns with `id`/`step_run_id` already remapped and
    `inherited_from` set), keeping everything else as recorded."""
    if not calls:
        return
    cols = ["workflow_run_id", *_LLM_COLS, "inherited_from", "created_at"]
    sql = f"INSERT INTO llm_calls ({', '.join(cols)}) VALUES ({', '.join(f'${n}' for n in range(1, len(cols) + 1))})"
    await conn.executemany(sql, [(fork_id, *(c[k] for k in cols[1:])) for c in calls])


async def copy_traces(conn: asyncpg.Connection, fork_id: str, traces: list[dict[str, Any]]) -> None:
    if not traces:
        return
    cols = ["workflow_run_id", *_TRACE_COLS, "inherited_from", "created_at"]
    sql = f"INSERT INTO tool_trace ({', '.join(cols)}) VALUES ({', '.join(f'${n}' for n in range(1, len(cols) + 1))})"
    await conn.executemany(sql, [(fork_id, *(t[k] for k in cols[1:])) for t in traces])


async def set_current_step(conn: asyncpg.Connection, fork_id: str, step_run_id: str) -> None:
    await conn.execute(
        "UPDATE workflow_runs SET current_step_run_id = $2 WHERE id = $1", fork_id, step_run_id
    )


async def append_event(
    conn: asyncpg.Connection,
    run_id: str,
    event_type: str,
    payload: dict[str, Any],
    step_run_id: str | None = None,
) -> None:
    """An event on any run, its sequence taken from the run's counter in the same statement (not
    lease-fenced: forking never moves the origin, it only records that it was forked)."""
    await conn.execute(
        "WITH r AS (UPDATE workflow_runs SET event_seq = event_seq + 1 WHERE id = $2 RETURNING event_seq) "
        "INSERT INTO workflow_events (id, workflow_run_id, step_run_id, sequence, event_type, payload) "
        "SELECT $1, $2, $3, r.event_seq, $4, $5 FROM r",
        new_id("evt"),
        run_id,
        step_run_id,
        event_type,
        payload,
    )


async def recorded_results(conn: asyncpg.Connection | asyncpg.Pool, run_id: str) -> list[asyncpg.Record]:
    """The origin's committed tool results a replay answers from, oldest first."""
    return list(
        await conn.fetch(
            "SELECT t.tool_name, t.input_json, t.output_json, t.status, t.error, t.error_code, t.result_text, "
            "t.state_updates, t.goto_step, t.tool_call_id, c.response "
            "FROM tool_trace t LEFT JOIN llm_calls c ON c.id = t.llm_call_id "
            "WHERE t.workflow_run_id = $1 ORDER BY t.round, t.created_at, t.sequence",
            run_id,
        )
    )


async def replay_source(
    conn: asyncpg.Connection | asyncpg.Pool, run_id: str
) -> tuple[str | None, str | None]:
    """(replay_of, replay_tools) of a run: whether its tool calls are answered from a recording."""
    row = await conn.fetchrow("SELECT replay_of, replay_tools FROM workflow_runs WHERE id = $1", run_id)
    return (row["replay_of"], row["replay_tools"]) if row is not None else (None, None)


async def own_tool_calls(conn: asyncpg.Connection | asyncpg.Pool, run_id: str) -> list[asyncpg.Record]:
    """A replay's own committed tool calls (not the inherited ones), oldest first."""
    return list(
        await conn.fetch(
            "SELECT tool_name, input_json, error_code FROM tool_trace WHERE workflow_run_id = $1 "
            "AND inherited_from IS NULL ORDER BY round, created_at, sequence",
            run_id,
        )
    )


async def last_runs(
    conn: asyncpg.Connection | asyncpg.Pool, workspace_id: str, definition_name: str, limit: int
) -> list[str]:
    """The ids of the last `limit` ended (COMPLETED or FAILED) runs of any version of the
    definition `definition_name`, newest first; replays are not counted (a replay's origin is)."""
    rows = await conn.fetch(
        "SELECT r.id FROM workflow_runs r JOIN workflow_definitions d ON d.id = r.definition_id "
        "WHERE r.workspace_id = $1 AND d.name = $2 AND r.status IN ('COMPLETED', 'FAILED') "
        "AND r.replay_of IS NULL ORDER BY r.created_at DESC, r.id DESC LIMIT $3",
        workspace_id,
        definition_name,
        limit,
    )
    return [r["id"] for r in rows]


async def run_summaries(
    conn: asyncpg.Connection | asyncpg.Pool, workspace_id: str, run_ids: list[str]
) -> dict[str, asyncpg.Record]:
    """Per run of the workspace among `run_ids`: status, output, error, its completed model calls
    (`rounds`), tool calls, tokens, cost and latency (start to end, NULL while it runs)."""
    rows = await conn.fetch(
        "SELECT r.id, r.status, r.output, r.error, r.replay_of, r.replay_tools, r.total_input_tokens, "
        "r.total_output_tokens, r.total_cost_cents, r.created_at, "
        "(extract(epoch FROM coalesce(r.completed_at, r.failed_at, r.cancelled_at) - r.started_at) * 1000)"
        "::float8 AS latency_ms, "
        "(SELECT count(*) FROM llm_calls c WHERE c.workflow_run_id = r.id AND c.status = 'completed') AS rounds, "
        "(SELECT count(*) FROM tool_trace t WHERE t.workflow_run_id = r.id) AS tool_calls "
        "FROM workflow_runs r WHERE r.workspace_id = $1 AND r.id = ANY($2::text[])",
        workspace_id,
        run_ids,
    )
    return {r["id"]: r for r in rows}


async def failed_runs(
    conn: asyncpg.Connection | asyncpg.Pool,
    workspace_id: str,
    *,
    definition_name: str | None,
    since: Any,
    until: Any,
    run_ids: list[str] | None,
    limit: int,
) -> list[str]:
    """The FAILED runs of the workspace a bulk retry takes, oldest failure first: of any version
    of `definition_name`, failed in [since, until) (each bound optional), or among `run_ids`."""
    rows = await conn.fetch(
        "SELECT r.id FROM workflow_runs r JOIN workflow_definitions d ON d.id = r.definition_id "
        "WHERE r.workspace_id = $1 AND r.status = 'FAILED' "
        "AND ($2::text IS NULL OR d.name = $2) "
        "AND ($3::timestamptz IS NULL OR r.failed_at >= $3) AND ($4::timestamptz IS NULL OR r.failed_at < $4) "
        "AND ($5::text[] IS NULL OR r.id = ANY($5)) "
        "ORDER BY r.failed_at, r.id LIMIT $6",
        workspace_id,
        definition_name,
        since,
        until,
        run_ids,
        limit,
    )
    return [r["id"] for r in rows]


async def store_definition_version(
    conn: asyncpg.Connection | asyncpg.Pool, definition_id: str, version: str, steps: list[Any]
) -> str:
    """A copy of a definition under another version with other steps (a fork's model or system
    prompt edit); the stored copy's id when that version exists already (same content, same version)."""
    created: str | None = await conn.fetchval(
        "INSERT INTO workflow_definitions (id, workspace_id, name, version, description, steps, "
        "input_schema, default_params, budget, concurrency, priority) "
        "SELECT $1, workspace_id, name, $3, description, $4, input_schema, default_params, budget, "
        "concurrency, priority FROM workflow_definitions WHERE id = $2 "
        "ON CONFLICT ON CONSTRAINT uq_definition_version DO NOTHING RETURNING id",
        new_id("wfdef"),
        definition_id,
        version,
        steps,
    )
    if created is not None:
        return created
    existing: str = await conn.fetchval(
        "SELECT d.id FROM workflow_definitions d JOIN workflow_definitions o "
        "ON o.workspace_id = d.workspace_id AND o.name = d.name WHERE o.id = $1 AND d.version = $2",
        definition_id,
        version,
    )
    return existing
