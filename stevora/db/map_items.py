"""Statements on `map` steps: the fan-out of one map step run (`map_steps`) and its items
(`map_items`), and the child runs started for them. Callers own the transaction. Going WAITING,
the parent's re-check and recording endings (`record_endings`) hold the parent run's row lock; a
child's ending takes none: it ends its item in its own statement (migration 0028), and the parent
records a batch of endings afterwards.

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
    """Write an ended child run's result on its running item(s) and count it, for a child cancelled
    with its parent (the parent, ending in the same transaction, gets no progress events)."""
    await conn.execute(
        "WITH ended AS (UPDATE map_items SET status = $2, output = $3, error = $4, ended_at = now() "
        "WHERE child_run_id = $1 AND status = 'running' RETURNING step_run_id) "
        "UPDATE map_steps m SET running = m.running - c.n, failed = m.failed + c.n "
        "FROM (SELECT step_run_id, count(*) AS n FROM ended GROUP BY step_run_id) c "
        "WHERE m.step_run_id = c.step_run_id",
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
    """A child run's ending, for its map, in one statement that waits for no sibling and takes no
    parent lock (`stevora_map_end_item`, migration 0028): the result on its running item(s), marked
    `unrecorded`, and, when the item is the current map's of a WAITING parent and no failure stops
    the map, its slot passed on to the first pending item no sibling is starting (`SKIP LOCKED`),
    a PENDING child run noted on the ended item (`passed_to`). Returns `ended` (items written: 0
    when written already) and `started_child`.

    A child going COMPLETED or FAILED runs this inside its own terminal statement (the
    `map_child_ended` trigger); the engine calls it for a child cancelled on its own. Recording the
    ending on the parent is `record_endings`, after the commit. Exactly once: only a `running` item
    is ended and only a `pending` one started, each in the statement that moves it; the child's
    idempotency key `map:<step run>:<index>` backs the start."""
    row: asyncpg.Record = await conn.fetchrow(
        "SELECT ended, started_child FROM stevora_map_end_item($1, $2, $3, $4, $5)",
        child["id"],
        child["parent_run_id"],
        status,
        output,
        error,
    )
    return row


async def record_endings(conn: asyncpg.Connection | asyncpg.Pool, parent_run_id: str) -> list[str]:
    """Record every ended, unrecorded item of the parent's maps, in one statement under the
    parent's row lock (`stevora_map_record`, migration 0028): the counts, the `MAP_ITEM_*` events
    (an ending, then the start it passed its slot to), a start taken back if the map no longer
    wants it, and the parent's wait made due when the map is done. Returns the runs to dispatch
    after the commit (the children started, the parent when due). A no-op, taking no lock, when
    nothing is unrecorded."""
    started: list[str] = await conn.fetchval("SELECT stevora_map_record($1)", parent_run_id)
    return started


async def pending_once_unlocked(
    conn: asyncpg.Connection, parent_run_id: str, run_ids: list[str]
) -> list[str]:
    """The runs of `run_ids` still PENDING, once the transaction holding the parent's row lock has
    ended (this waits for it: `FOR SHARE`, in the caller's transaction)."""
    await conn.execute("SELECT 1 FROM workflow_runs WHERE id = $1 FOR SHARE", parent_run_id)
    rows = await conn.fetch(
        "SELECT id FROM workflow_runs WHERE id = ANY($1::text[]) AND status = 'PENDING'", run_ids
    )
    return [r["id"] for r in rows]


async def parents_with_unrecorded(pool: asyncpg.Pool, older_than_s: float, limit: int) -> list[str]:
    """Parents with an item ended more than `older_than_s` ago and still unrecorded: the worker
    that ended it died before recording it (or is about to)."""
    rows = await pool.fetch(
        "SELECT DISTINCT workflow_run_id FROM map_items WHERE unrecorded "
        "AND ended_at < now() - make_interval(secs => $1) LIMIT $2",
        older_than_s,
        limit,
    )
    return [r["workflow_run_id"] for r in rows]


async def get_map(conn: asyncpg.Connection | asyncpg.Pool, step_run_id: str) -> asyncpg.Record | None:
    return await conn.fetchrow(f"SELECT {_HEADER} FROM map_steps m WHERE m.step_run_id = $1", step_run_id)


async def lock_map(conn: asyncpg.Connection, step_run_id: str) -> asyncpg.Record | None:
    """The map's header, row-locked until the caller's transaction ends: a recording of its items'
    endings (`record_endings`) waits for it, or committed before. Lock it before the parent run's
    row, the order a recording takes."""
    return await conn.fetchrow(
        f"SELECT {_HEADER} FROM map_steps m WHERE m.step_run_id = $1 FOR NO KEY UPDATE", step_run_id
    )


async def items(
    conn: asyncpg.Connection | asyncpg.Pool, step_run_id: str, limit: int | None = None
) -> list[asyncpg.Record]:
    """A map's items in index order (the first `limit`), each with its child input, its child
    run's status and whether its ending is recorded on the parent yet."""
    return list(
        await conn.fetch(
            "SELECT i.item_index, i.input, i.status, i.child_run_id, i.output, i.error, i.started_at, i.ended_at, "
            "i.unrecorded, r.status AS child_status FROM map_items i LEFT JOIN workflow_runs r ON r.id = i.child_run_id "
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
