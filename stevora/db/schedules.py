"""Schedules' SQL: the rows, the due pass's claim (`FOR UPDATE SKIP LOCKED`) and the ticks.

The exactly-once key of a tick is the run's idempotency key (`stevora.triggers.schedules`);
`schedule_ticks` records which run a tick started, for `lastRuns` and the overlap policies.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from stevora.ids import new_id

SCHEDULE_COLUMNS = (
    "id, workspace_id, name, definition_name, definition_version, source, cron, interval_s, "
    "timezone, input, overlap, catchup_window_s, jitter_s, start_at, end_at, paused, next_fire_at, "
    "next_due_at, buffered_at, last_run_id, ticks_run, ticks_skipped, created_at, updated_at"
)
# What PATCH and a definition's `schedule` may change (column names: never from the caller).
SETTABLE = frozenset(
    {
        "name",
        "definition_name",
        "definition_version",
        "cron",
        "interval_s",
        "timezone",
        "input",
        "overlap",
        "catchup_window_s",
        "jitter_s",
        "start_at",
        "end_at",
        "paused",
        "next_fire_at",
        "next_due_at",
        "buffered_at",
    }
)


async def insert_schedule(
    conn: asyncpg.Connection, workspace_id: str, fields: dict[str, Any]
) -> asyncpg.Record | None:
    """None when the workspace already has a schedule of that name."""
    names = sorted(fields)
    _check_settable(names, extra={"source", "created_at"})
    columns = ", ".join(["id", "workspace_id", *names])
    params = ", ".join(f"${i}" for i in range(1, len(names) + 3))
    return await conn.fetchrow(
        f"INSERT INTO schedules ({columns}) VALUES ({params}) "
        f"ON CONFLICT (workspace_id, name) DO NOTHING RETURNING {SCHEDULE_COLUMNS}",
        new_id("sch"),
        workspace_id,
        *(fields[n] for n in names),
    )


async def get_schedule(
    conn: asyncpg.Connection | asyncpg.Pool, workspace_id: str, schedule_id: str, *, lock: bool = False
) -> asyncpg.Record | None:
    return await conn.fetchrow(
        f"SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE workspace_id = $1 AND id = $2"
        + (" FOR UPDATE" if lock else ""),
        workspace_id,
        schedule_id,
    )


async def get_by_name(conn: asyncpg.Connection, workspace_id: str, name: str) -> asyncpg.Record | None:
    return await conn.fetchrow(
        f"SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE workspace_id = $1 AND name = $2 FOR UPDATE",
        workspace_id,
        name,
    )


async def list_schedules(
    conn: asyncpg.Connection | asyncpg.Pool, workspace_id: str, offset: int, limit: int
) -> tuple[list[asyncpg.Record], int]:
    total = await conn.fetchval("SELECT count(*) FROM schedules WHERE workspace_id = $1", workspace_id)
    rows = await conn.fetch(
        f"SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE workspace_id = $1 "
        "ORDER BY created_at DESC, id DESC OFFSET $2 LIMIT $3",
        workspace_id,
        offset,
        limit,
    )
    return list(rows), int(total or 0)


async def update_schedule(
    conn: asyncpg.Connection, schedule_id: str, sets: dict[str, Any]
) -> asyncpg.Record | None:
    names = sorted(sets)
    _check_settable(names)
    assignments = ", ".join(f"{n} = ${i}" for i, n in enumerate(names, start=2))
    return await conn.fetchrow(
        f"UPDATE schedules SET {assignments}, updated_at = now() WHERE id = $1 RETURNING {SCHEDULE_COLUMNS}",
        schedule_id,
        *(sets[n] for n in names),
    )


async def delete_schedule(
    conn: asyncpg.Connection | asyncpg.Pool, workspace_id: str, schedule_id: str
) -> asyncpg.Record | None:
    return await conn.fetchrow(
        f"DELETE FROM schedules WHERE workspace_id = $1 AND id = $2 RETURNING {SCHEDULE_COLUMNS}",
        workspace_id,
        schedule_id,
    )


async def delete_definition_schedule(conn: asyncpg.Connection, workspace_id: str, name: str) -> None:
    await conn.execute(
        "DELETE FROM schedules WHERE workspace_id = $1 AND name = $2 AND source = 'definition'",
        workspace_id,
        name,
    )


async def database_now(conn: asyncpg.Connection) -> datetime:
    """The database's clock: the one clock every worker and API process agrees on."""
    now: datetime = await conn.fetchval("SELECT clock_timestamp()")
    return now


_CLAIMED_COLUMNS = ", ".join(f"s.{c.strip()}" for c in SCHEDULE_COLUMNS.split(","))


async def claim_due(conn: asyncpg.Connection, limit: int) -> tuple[datetime, list[asyncpg.Record]]:
    """The database's clock and the schedules due now (or holding a buffered tick), locked; other
    workers skip them. The database's clock decides, so workers' clock skew does not matter.

    One statement: each row also carries `last_run_status` (its last run's status now) and
    `target_definition_id` (the definition version a tick starts now, None when it is gone)."""
    rows = await conn.fetch(
        "WITH clock AS MATERIALIZED (SELECT clock_timestamp() AS now) "
        f"SELECT {_CLAIMED_COLUMNS}, (SELECT now FROM clock) AS now, r.status AS last_run_status, "
        "d.id AS target_definition_id FROM schedules s "
        "LEFT JOIN workflow_runs r ON r.id = s.last_run_id "
        "LEFT JOIN LATERAL (SELECT w.id FROM workflow_definitions w WHERE w.workspace_id = s.workspace_id "
        "AND w.name = s.definition_name AND (s.definition_version = 'latest' OR w.version = s.definition_version) "
        "ORDER BY w.created_at DESC, w.id DESC LIMIT 1) d ON true "
        "WHERE NOT s.paused AND (s.next_due_at <= (SELECT now FROM clock) OR s.buffered_at IS NOT NULL) "
        "ORDER BY s.next_due_at LIMIT $1 FOR UPDATE OF s SKIP LOCKED",
        limit,
    )
    if rows:
        return rows[0]["now"], list(rows)
    return await database_now(conn), []


async def run_status(conn: asyncpg.Connection, run_id: str | None) -> str | None:
    if run_id is None:
        return None
    status: str | None = await conn.fetchval("SELECT status FROM workflow_runs WHERE id = $1", run_id)
    return status


async def record_tick(
    conn: asyncpg.Connection, schedule_id: str, scheduled_at: datetime, run_id: str, kind: str
) -> None:
    await conn.execute(
        "INSERT INTO schedule_ticks (schedule_id, scheduled_at, run_id, kind, created_at) "
        "VALUES ($1, $2, $3, $4, clock_timestamp()) "
        "ON CONFLICT (schedule_id, scheduled_at) DO NOTHING",
        schedule_id,
        scheduled_at,
        run_id,
        kind,
    )


async def record_ticks(conn: asyncpg.Connection, ticks: list[tuple[str, datetime, str]], kind: str) -> None:
    """Many (schedule id, scheduled_at, run id) rows in one statement; a tick recorded stays."""
    await conn.execute(
        "INSERT INTO schedule_ticks (schedule_id, scheduled_at, run_id, kind, created_at) "
        "SELECT t.sid, t.at, t.run, $4, clock_timestamp() FROM unnest($1::text[], $2::timestamptz[], $3::text[]) "
        "AS t(sid, at, run) ON CONFLICT (schedule_id, scheduled_at) DO NOTHING",
        [t[0] for t in ticks],
        [t[1] for t in ticks],
        [t[2] for t in ticks],
        kind,
    )


@dataclass(frozen=True, slots=True)
class Advance:
    """What the due pass did with one schedule: its next tick, its buffered tick, its last run
    (None: unchanged) and the ticks it ran and skipped (added to the counters)."""

    schedule_id: str
    next_fire_at: datetime | None
    next_due_at: datetime | None
    buffered_at: datetime | None
    last_run_id: str | None
    ran: int
    skipped: int


async def advance_many(conn: asyncpg.Connection, advances: list[Advance]) -> None:
    """`advance` for many schedules in one statement."""
    await conn.execute(
        "UPDATE schedules s SET next_fire_at = a.fire, next_due_at = a.due, buffered_at = a.buffered, "
        "last_run_id = COALESCE(a.last_run, s.last_run_id), ticks_run = s.ticks_run + a.ran, "
        "ticks_skipped = s.ticks_skipped + a.skipped, updated_at = now() "
        "FROM unnest($1::text[], $2::timestamptz[], $3::timestamptz[], $4::timestamptz[], $5::text[], "
        "$6::int[], $7::int[]) AS a(id, fire, due, buffered, last_run, ran, skipped) WHERE s.id = a.id",
        [a.schedule_id for a in advances],
        [a.next_fire_at for a in advances],
        [a.next_due_at for a in advances],
        [a.buffered_at for a in advances],
        [a.last_run_id for a in advances],
        [a.ran for a in advances],
        [a.skipped for a in advances],
    )


async def advance(
    conn: asyncpg.Connection,
    schedule_id: str,
    *,
    next_fire_at: datetime | None,
    next_due_at: datetime | None,
    buffered_at: datetime | None,
    last_run_id: str | None,
    ran: int,
    skipped: int,
) -> None:
    """After the due pass handled a schedule: its next tick, and what it did (counted)."""
    await conn.execute(
        "UPDATE schedules SET next_fire_at = $2, next_due_at = $3, buffered_at = $4, "
        "last_run_id = COALESCE($5, last_run_id), ticks_run = ticks_run + $6, "
        "ticks_skipped = ticks_skipped + $7, updated_at = now() WHERE id = $1",
        schedule_id,
        next_fire_at,
        next_due_at,
        buffered_at,
        last_run_id,
        ran,
        skipped,
    )


async def set_last_run(conn: asyncpg.Connection, schedule_id: str, run_id: str) -> None:
    await conn.execute(
        "UPDATE schedules SET last_run_id = $2, ticks_run = ticks_run + 1, updated_at = now() WHERE id = $1",
        schedule_id,
        run_id,
    )


async def last_runs(
    conn: asyncpg.Connection | asyncpg.Pool, schedule_id: str, limit: int = 10
) -> list[asyncpg.Record]:
    """Newest first: each tick's run, its `scheduled_at`, and the run's status now."""
    rows = await conn.fetch(
        "SELECT t.run_id, t.scheduled_at, t.kind, r.status FROM schedule_ticks t "
        "LEFT JOIN workflow_runs r ON r.id = t.run_id WHERE t.schedule_id = $1 "
        "ORDER BY t.scheduled_at DESC LIMIT $2",
        schedule_id,
        limit,
    )
    return list(rows)


def _check_settable(names: list[str], extra: set[str] | frozenset[str] = frozenset()) -> None:
    unknown = set(names) - SETTABLE - set(extra)
    if unknown:
        raise ValueError(f"not schedule columns: {sorted(unknown)}")
