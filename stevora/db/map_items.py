"""Statements on `map` steps: the fan-out of one map step run (`map_steps`) and its items
(`map_items`), and the child runs started for them. Callers own the transaction and hold the
parent run's row lock, which serialises everything that changes one parent's items.

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

from stevora.db.runs import ROW_LOCK
from stevora.events import Event
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
        "AND status = 'pending' ORDER BY item_index LIMIT $2 FOR UPDATE), "
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
) -> list[asyncpg.Record]:
    """Write an ended child run's result on its running item(s) (a retried map shares a still
    running child with the step run it retries) and count it on their maps. Returns each map's
    header, with the item's `item_index`; nothing when the item was written already."""
    failed = status != MapItemStatus.COMPLETED
    return list(
        await conn.fetch(
            "WITH items AS (UPDATE map_items SET status = $2, output = $3, error = $4, ended_at = now() "
            "WHERE child_run_id = $1 AND status = 'running' RETURNING step_run_id, item_index), "
            "counted AS (UPDATE map_steps m SET running = m.running - 1, completed = m.completed + $5, "
            "failed = m.failed + $6 FROM items WHERE m.step_run_id = items.step_run_id "
            f"RETURNING {_HEADER}, items.item_index) "
            "SELECT * FROM counted",
            child_run_id,
            status,
            output,
            error,
            0 if failed else 1,
            1 if failed else 0,
        )
    )


async def lock_parent(conn: asyncpg.Connection, run_id: str) -> asyncpg.Record | None:
    """The parent run's row lock, reading only what a child's ending needs (not its input and
    state, which for a map may hold every item)."""
    return await conn.fetchrow(
        "SELECT id, workspace_id, status, current_step_run_id, depth FROM workflow_runs "
        f"WHERE id = $1 {ROW_LOCK}",
        run_id,
    )


async def write_events(conn: asyncpg.Connection, run_id: str, events: list[Event], *, due: bool) -> bool:
    """The WAITING parent's progress events (its `event_seq` bumped, the events inserted, one
    statement); `due`: its wait is due now (the map is done: its worker collects). False when
    the run is not WAITING (nothing written)."""
    written = await conn.fetchval(
        "WITH bumped AS (UPDATE workflow_runs SET event_seq = event_seq + $2, version = version + 1, "
        "updated_at = now(), next_run_at = CASE WHEN $3 THEN now() ELSE next_run_at END "
        "WHERE id = $1 AND status = 'WAITING' RETURNING event_seq), "
        "ins AS (INSERT INTO workflow_events (id, workflow_run_id, step_run_id, sequence, event_type, payload) "
        "SELECT e.id, $1, e.step_run_id, (SELECT event_seq FROM bumped) - $2 + e.ord, e.event_type, e.payload "
        "FROM unnest($4::text[], $5::text[], $6::text[], $7::jsonb[]) WITH ORDINALITY "
        "AS e(id, step_run_id, event_type, payload, ord) WHERE EXISTS (SELECT 1 FROM bumped)) "
        "SELECT count(*) FROM bumped",
        run_id,
        len(events),
        due,
        [new_id("evt") for _ in events],
        [e.step_run_id for e in events],
        [e.event_type for e in events],
        [e.payload for e in events],
    )
    return bool(written)


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
