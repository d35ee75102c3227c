"""Statements on `map` steps: the fan-out of one map step run (`map_steps`) and its items
(`map_items`), and the child runs started for them. Callers own the transaction. Going WAITING
and the parent's re-check hold the parent run's row lock; a child's ending takes it only inside
its COMMIT, in the `map_item_ended` trigger (migration 0027) that counts the item, writes the
progress events and makes the parent's wait due, so siblings' endings serialise on that alone.

Exactly once per item: an item moves `pending → running` in the statement that inserts its child
run, and only a `pending` row can be picked, so a replayed or concurrent start finds nothing to
start; the child run's idempotency key `map:<step run>:<index>` makes a second child for one item
impossible even by hand.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from stevora.ids import new_id
from stevora.statuses import MapItemStatus

_HEADER = (
    "m.step_run_id, m.workflow_run_id, m.step_name, m.child_definition_id, m.child_budget, m.concurrency, "
    "m.on_item_failure, m.total, m.running, m.completed, m.failed"
)


@dataclass(frozen=True, slots=True)
class NewMap:
    """A map step run's fan-out, written as the step goes WAITING."""

    step_run_id: str
    run_id: str
    step_name: str
    child_definition_id: str
    child_budget: dict[str, Any] | None
    concurrency: int
    on_item_failure: str
    inputs: Sequence[Any]  # each item's child input, by index


async def insert_map(conn: asyncpg.Connection, new: NewMap, carried: Sequence[asyncpg.Record]) -> None:
    """Write the map and its items: `carried` (items of the failed step run this one retries,
    already completed or still running) keep their child run and result; every other item is
    pending. Replays find the rows there and write nothing twice."""
    kept = {row["item_index"]: row for row in carried}
    running = sum(1 for row in kept.values() if row["status"] == MapItemStatus.RUNNING)
    completed = sum(1 for row in kept.values() if row["status"] == MapItemStatus.COMPLETED)
    await conn.execute(
        "INSERT INTO map_steps (step_run_id, workflow_run_id, step_name, child_definition_id, child_budget, "
        "concurrency, on_item_failure, total, running, completed) "
        "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT DO NOTHING",
        new.step_run_id,
        new.run_id,
        new.step_name,
        new.child_definition_id,
        new.child_budget,
        new.concurrency,
        new.on_item_failure,
        len(new.inputs),
        running,
        completed,
    )
    indexes = list(range(len(new.inputs)))
    await conn.execute(
        "INSERT INTO map_items (step_run_id, item_index, workflow_run_id, input, status, child_run_id, output, "
        "error, started_at, ended_at) "
        "SELECT $1, i.idx, $2, i.input, i.status, i.child_run_id, i.output, i.error, i.started_at, i.ended_at "
        "FROM unnest($3::int[], $4::jsonb[], $5::text[], $6::text[], $7::jsonb[], $8::jsonb[], "
        "$9::timestamptz[], $10::timestamptz[]) "
        "AS i(idx, input, status, child_run_id, output, error, started_at, ended_at) "
        "ON CONFLICT DO NOTHING",
        new.step_run_id,
        new.run_id,
        indexes,
        list(new.inputs),
        [kept[i]["status"] if i in kept else MapItemStatus.PENDING.value for i in indexes],
        [kept[i]["child_run_id"] if i in kept else None for i in indexes],
        [kept[i]["output"] if i in kept else None for i in indexes],
        [kept[i]["error"] if i in kept else None for i in indexes],
        [kept[i]["started_at"] if i in kept else None for i in indexes],
        [kept[i]["ended_at"] if i in kept else None for i in indexes],
    )


async def retried_items(
    conn: asyncpg.Connection | asyncpg.Pool, run_id: str, step_name: str, step_run_id: str
) -> list[asyncpg.Record]:
    """The items of the step run `step_run_id` retries: the latest earlier map of `step_name` in
    this run, if its step run FAILED (a loop back to a completed map starts afresh)."""
    return list(
        await conn.fetch(
            "WITH prev AS (SELECT m.step_run_id, s.status FROM map_steps m JOIN step_runs s ON s.id = m.step_run_id "
            "WHERE m.workflow_run_id = $1 AND m.step_name = $2 AND m.step_run_id <> $3 "
            "ORDER BY s.created_at DESC, s.id DESC LIMIT 1) "
            "SELECT i.item_index, i.input, i.status, i.child_run_id, i.output, i.error, i.started_at, i.ended_at "
            "FROM map_items i JOIN prev ON prev.step_run_id = i.step_run_id WHERE prev.status = 'FAILED' "
            "ORDER BY i.item_index",
            run_id,
            step_name,
            step_run_id,
        )
    )


async def start_pending(
    conn: asyncpg.Connection, parent: asyncpg.Record, header: asyncpg.Record, limit: int
) -> list[asyncpg.Record]:
    """Start the child runs of up to `limit` pending items, in index order (PENDING runs, to be
    dispatched after commit), and count them running, in one statement. Returns `(item_index,
    child_run_id)` rows."""
    pending = header["total"] - header["completed"] - header["failed"] - header["running"]
    limit = min(limit, pending)
    if limit <= 0:
        return []
    step_run_id = header["step_run_id"]
    started = await conn.fetch(
        "WITH picked AS (SELECT item_index, input FROM map_items WHERE step_run_id = $6::text "
        "AND status = 'pending' ORDER BY item_index LIMIT $2 FOR UPDATE SKIP LOCKED), "
        "new AS (SELECT ($1::text[])[row_number() OVER (ORDER BY item_index)] AS id, item_index AS idx, input "
        "FROM picked), "
        "children AS (INSERT INTO workflow_runs (id, workspace_id, definition_id, status, input, idempotency_key, "
        "dispatched_at, parent_run_id, depth, trace_context, budget) "
        "SELECT new.id, $3::text, $4::text, 'PENDING', new.input, 'map:' || $6::text || ':' || new.idx, now(), "
        "$7::text, $8::int, (SELECT trace_context FROM workflow_runs WHERE id = $7::text), $5::jsonb FROM new "
        "ON CONFLICT (workspace_id, idempotency_key) DO NOTHING RETURNING id), "
        "items AS (UPDATE map_items i SET status = 'running', child_run_id = new.id, started_at = now() "
        "FROM new JOIN children ON children.id = new.id "
        "WHERE i.step_run_id = $6::text AND i.item_index = new.idx AND i.status = 'pending' "
        "RETURNING i.item_index, i.child_run_id), "
        "counted AS (UPDATE map_steps SET running = running + (SELECT count(*) FROM items) "
        "WHERE step_run_id = $6::text) "
        "SELECT item_index, child_run_id FROM items ORDER BY item_index",
        [new_id("wfrun") for _ in range(limit)],
        limit,
        parent["workspace_id"],
        header["child_definition_id"],
        header["child_budget"],
        step_run_id,
        parent["id"],
        parent["depth"] + 1,
    )
    return list(started)


async def record_child_end(
    conn: asyncpg.Connection, child_run_id: str, status: str, output: Any, error: dict[str, Any] | None
) -> None:
    """Write an ended child run's result on its running item(s), for a child cancelled with its
    parent (the `map_item_ended` trigger counts it at commit; the parent, ending too, gets no
    progress events)."""
    await conn.execute(
        "UPDATE map_items SET status = $2, output = $3, error = $4, ended_at = now() "
        "WHERE child_run_id = $1 AND status = 'running'",
        child_run_id,
        status,
        output,
        error,
    )


async def end_item(
    conn: asyncpg.Connection,
    child: asyncpg.Record,
    status: str,
    output: Any,
    error: dict[str, Any] | None,
) -> asyncpg.Record:
    """A child run's ending, for its map, in one statement that waits for no sibling: write the
    result on its running item(s) (a retried map shares a still running child with the step run it
    retries) and, when the item is the current map's of a WAITING parent and no failure stops the
    map (this one, or a sibling's already counted, under `fail`), pass its slot on: start the child
    run of the first pending item that no sibling's ending is starting (`SKIP LOCKED`), PENDING, to
    dispatch after commit, and note it on the ended item (`passed_to`). Returns `ended` (items
    written: 0 when written already) and `started_child`.

    The rest is the `map_item_ended` trigger's (migration 0027), run inside COMMIT under the
    parent's row lock: the map's counts, the progress events and, when the map is done, the
    parent's wait made due; it takes the start back if the parent stopped waiting meanwhile.
    Exactly once: only a `running` item is ended and only a `pending` one started, each in the
    statement that moves it; the child's idempotency key `map:<step run>:<index>` backs the start."""
    row: asyncpg.Record = await conn.fetchrow(
        "WITH cur AS (SELECT i.step_run_id, m.child_definition_id, m.child_budget, p.workspace_id, p.depth, "
        "p.trace_context FROM map_items i JOIN map_steps m ON m.step_run_id = i.step_run_id "
        "JOIN workflow_runs p ON p.id = m.workflow_run_id AND p.current_step_run_id = m.step_run_id "
        "WHERE i.child_run_id = $1 AND i.status = 'running' AND p.status = 'WAITING' "
        "AND NOT (m.on_item_failure = 'fail' AND ($5 OR m.failed > 0))), "
        "picked AS (SELECT i.item_index, i.input FROM map_items i JOIN cur ON i.step_run_id = cur.step_run_id "
        "WHERE i.status = 'pending' ORDER BY i.item_index LIMIT 1 FOR UPDATE OF i SKIP LOCKED), "
        "children AS (INSERT INTO workflow_runs (id, workspace_id, definition_id, status, input, idempotency_key, "
        "dispatched_at, parent_run_id, depth, trace_context, budget) "
        "SELECT $6, cur.workspace_id, cur.child_definition_id, 'PENDING', picked.input, "
        "'map:' || cur.step_run_id || ':' || picked.item_index, now(), $7, cur.depth + 1, cur.trace_context, "
        "cur.child_budget FROM cur, picked "
        "ON CONFLICT (workspace_id, idempotency_key) DO NOTHING RETURNING id), "
        "started AS (UPDATE map_items i SET status = 'running', child_run_id = children.id, started_at = now() "
        "FROM cur, picked, children WHERE i.step_run_id = cur.step_run_id AND i.item_index = picked.item_index "
        "AND i.status = 'pending' RETURNING i.step_run_id, i.item_index, i.child_run_id), "
        "ended AS (UPDATE map_items i SET status = $2, output = $3, error = $4, ended_at = now(), "
        "passed_to = (SELECT s.item_index FROM started s WHERE s.step_run_id = i.step_run_id) "
        "WHERE i.child_run_id = $1 AND i.status = 'running' RETURNING i.item_index) "
        "SELECT (SELECT count(*) FROM ended) AS ended, (SELECT child_run_id FROM started) AS started_child",
        child["id"],
        status,
        output,
        error,
        status != MapItemStatus.COMPLETED,
        new_id("wfrun"),
        child["parent_run_id"],
    )
    return row


async def get_map(conn: asyncpg.Connection | asyncpg.Pool, step_run_id: str) -> asyncpg.Record | None:
    return await conn.fetchrow(f"SELECT {_HEADER} FROM map_steps m WHERE m.step_run_id = $1", step_run_id)


async def items(
    conn: asyncpg.Connection | asyncpg.Pool, step_run_id: str, limit: int | None = None
) -> list[asyncpg.Record]:
    """A map's items in index order (the first `limit`), each with its child input and its child
    run's status."""
    return list(
        await conn.fetch(
            "SELECT i.item_index, i.input, i.status, i.child_run_id, i.output, i.error, i.started_at, i.ended_at, "
            "r.status AS child_status FROM map_items i LEFT JOIN workflow_runs r ON r.id = i.child_run_id "
            "WHERE i.step_run_id = $1 ORDER BY i.item_index LIMIT $2",
            step_run_id,
            limit,
        )
    )


async def item_of_child(conn: asyncpg.Connection | asyncpg.Pool, child_run_id: str) -> asyncpg.Record | None:
    """The map item a child run was started for (its latest, if a retry took it over)."""
    return await conn.fetchrow(
        "SELECT m.step_name, m.total, i.item_index, i.step_run_id FROM map_items i "
        "JOIN map_steps m ON m.step_run_id = i.step_run_id WHERE i.child_run_id = $1 "
        "ORDER BY m.created_at DESC LIMIT 1",
        child_run_id,
    )


async def maps_of_run(conn: asyncpg.Connection | asyncpg.Pool, run_id: str) -> list[asyncpg.Record]:
    """Every map step run of a run, oldest first: its progress counters, for the run's views."""
    return list(
        await conn.fetch(
            f"SELECT {_HEADER}, m.created_at FROM map_steps m WHERE m.workflow_run_id = $1 ORDER BY m.created_at",
            run_id,
        )
    )
