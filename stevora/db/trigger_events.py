"""Events' SQL: the events received (one row per id), the runs each started or resumed, the
definitions' event triggers, and the runs waiting for an event."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import asyncpg

from stevora.ids import new_id

EVENT_COLUMNS = "id, workspace_id, event_key, name, data, ts, source, received_at, processed_at"


async def insert_event(
    conn: asyncpg.Connection | asyncpg.Pool,
    workspace_id: str,
    *,
    event_key: str | None,
    name: str,
    data: Any,
    ts: datetime | None,
    source: str,
) -> asyncpg.Record | None:
    """The new event (committed on its own: it is stored before it is processed); None when its
    id was seen before."""
    event_id = new_id("tev")
    return await conn.fetchrow(
        "INSERT INTO trigger_events (id, workspace_id, event_key, name, data, ts, source) "
        "VALUES ($1::text, $2, COALESCE($3::text, $1::text), $4, $5, COALESCE($6::timestamptz, now()), $7) "
        f"ON CONFLICT (workspace_id, event_key) DO NOTHING RETURNING {EVENT_COLUMNS}",
        event_id,
        workspace_id,
        event_key,
        name,
        data,
        ts,
        source,
    )


async def event_by_key(
    conn: asyncpg.Connection | asyncpg.Pool, workspace_id: str, event_key: str
) -> asyncpg.Record | None:
    return await conn.fetchrow(
        f"SELECT {EVENT_COLUMNS} FROM trigger_events WHERE workspace_id = $1 AND event_key = $2",
        workspace_id,
        event_key,
    )


async def events_by_ids(
    conn: asyncpg.Connection | asyncpg.Pool, event_ids: list[str]
) -> list[asyncpg.Record]:
    rows = await conn.fetch(
        f"SELECT {EVENT_COLUMNS} FROM trigger_events WHERE id = ANY($1::text[]) ORDER BY received_at, id",
        event_ids,
    )
    return list(rows)


async def add_event_run(conn: asyncpg.Connection, event_id: str, run_id: str, kind: str) -> None:
    await conn.execute(
        "INSERT INTO trigger_event_runs (event_id, run_id, kind) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
        event_id,
        run_id,
        kind,
    )


async def runs_of_events(
    conn: asyncpg.Connection | asyncpg.Pool, event_ids: list[str]
) -> dict[str, list[asyncpg.Record]]:
    """Each event's runs (started or resumed), oldest first, with their status now."""
    rows = await conn.fetch(
        "SELECT e.event_id, e.run_id, e.kind, r.status, r.definition_id FROM trigger_event_runs e "
        "LEFT JOIN workflow_runs r ON r.id = e.run_id WHERE e.event_id = ANY($1::text[]) "
        "ORDER BY e.created_at, e.run_id",
        event_ids,
    )
    out: dict[str, list[asyncpg.Record]] = {}
    for row in rows:
        out.setdefault(row["event_id"], []).append(row)
    return out


async def list_events(
    conn: asyncpg.Connection | asyncpg.Pool, workspace_id: str, name: str | None, offset: int, limit: int
) -> tuple[list[asyncpg.Record], int]:
    """Newest first, optionally of one name."""
    total = await conn.fetchval(
        "SELECT count(*) FROM trigger_events WHERE workspace_id = $1 AND ($2::text IS NULL OR name = $2)",
        workspace_id,
        name,
    )
    rows = await conn.fetch(
        f"SELECT {EVENT_COLUMNS} FROM trigger_events WHERE workspace_id = $1 "
        "AND ($2::text IS NULL OR name = $2) ORDER BY received_at DESC, id DESC OFFSET $3 LIMIT $4",
        workspace_id,
        name,
        offset,
        limit,
    )
    return list(rows), int(total or 0)


async def triggers_for(
    conn: asyncpg.Connection | asyncpg.Pool, workspace_id: str, event_name: str
) -> list[asyncpg.Record]:
    rows = await conn.fetch(
        "SELECT definition_name, trigger_index, definition_id, spec FROM event_triggers "
        "WHERE workspace_id = $1 AND event_name = $2 ORDER BY definition_name, trigger_index",
        workspace_id,
        event_name,
    )
    return list(rows)


async def trigger_of(
    conn: asyncpg.Connection, workspace_id: str, definition_id: str, trigger_index: int
) -> asyncpg.Record | None:
    return await conn.fetchrow(
        "SELECT definition_name, trigger_index, definition_id, spec FROM event_triggers "
        "WHERE workspace_id = $1 AND definition_id = $2 AND trigger_index = $3",
        workspace_id,
        definition_id,
        trigger_index,
    )


async def replace_triggers(
    conn: asyncpg.Connection,
    workspace_id: str,
    definition_name: str,
    definition_id: str,
    triggers: list[tuple[str, dict[str, Any]]],
) -> None:
    """The definition name's triggers become those of its newest version (`definition_id`)."""
    await conn.execute(
        "DELETE FROM event_triggers WHERE workspace_id = $1 AND definition_name = $2",
        workspace_id,
        definition_name,
    )
    if triggers:
        await conn.executemany(
            "INSERT INTO event_triggers (workspace_id, definition_name, trigger_index, definition_id, "
            "event_name, spec) VALUES ($1, $2, $3, $4, $5, $6)",
            [
                (workspace_id, definition_name, index, definition_id, event, spec)
                for index, (event, spec) in enumerate(triggers)
            ],
        )


async def runs_waiting_for(
    conn: asyncpg.Connection | asyncpg.Pool, workspace_id: str, signal_type: str
) -> list[asyncpg.Record]:
    """Runs whose current `external_event` step waits for this event (oldest wait first)."""
    rows = await conn.fetch(
        "SELECT r.id, r.definition_id, r.input, r.state, s.step_name FROM workflow_runs r "
        "JOIN step_runs s ON s.id = r.current_step_run_id "
        "WHERE r.workspace_id = $1 AND r.status = 'WAITING' AND s.status = 'WAITING' "
        "AND s.step_type = 'external_event' AND s.signal_type = $2 ORDER BY s.started_at, r.id",
        workspace_id,
        signal_type,
    )
    return list(rows)


async def lock_unprocessed(conn: asyncpg.Connection, event_id: str) -> asyncpg.Record | None:
    """The event, locked, if nobody processed it yet and nobody is processing it now."""
    return await conn.fetchrow(
        f"SELECT {EVENT_COLUMNS} FROM trigger_events WHERE id = $1 AND processed_at IS NULL "
        "FOR UPDATE SKIP LOCKED",
        event_id,
    )


async def mark_processed(conn: asyncpg.Connection, event_id: str) -> None:
    await conn.execute("UPDATE trigger_events SET processed_at = clock_timestamp() WHERE id = $1", event_id)


async def is_processed(conn: asyncpg.Connection | asyncpg.Pool, event_id: str) -> bool:
    return bool(
        await conn.fetchval("SELECT processed_at IS NOT NULL FROM trigger_events WHERE id = $1", event_id)
    )


async def stale_unprocessed(
    conn: asyncpg.Connection | asyncpg.Pool, older_than_s: float, limit: int
) -> list[str]:
    """Events stored but not processed for a while (the API process died in between)."""
    rows = await conn.fetch(
        "SELECT id FROM trigger_events WHERE processed_at IS NULL "
        "AND received_at < clock_timestamp() - make_interval(secs => $1) ORDER BY received_at LIMIT $2",
        older_than_s,
        limit,
    )
    return [r["id"] for r in rows]
