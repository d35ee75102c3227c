"""Debounce and batch groups' SQL (`pending_triggers`): one open group per key, fired once."""

from __future__ import annotations

from datetime import timedelta

import asyncpg

from stevora.ids import new_id

GROUP_COLUMNS = "id, workspace_id, group_key, kind, definition_id, trigger_index, event_ids, due_at"


async def add_to_group(
    conn: asyncpg.Connection,
    workspace_id: str,
    group_key: str,
    kind: str,
    definition_id: str,
    trigger_index: int,
    event_id: str,
    wait: timedelta,
) -> asyncpg.Record:
    """Open the group (due `wait` from now) or add the event to it. A debounce group's due time
    moves to `wait` after each event; a batch's stays `wait` after its first."""
    due = "excluded.due_at" if kind == "debounce" else "pending_triggers.due_at"
    row = await conn.fetchrow(
        "INSERT INTO pending_triggers (id, workspace_id, group_key, kind, definition_id, trigger_index, "
        "event_ids, due_at) VALUES ($1, $2, $3, $4, $5, $6, jsonb_build_array($7::text), "
        "clock_timestamp() + $8) ON CONFLICT (group_key) DO UPDATE SET "
        f"event_ids = pending_triggers.event_ids || excluded.event_ids, due_at = {due}, "
        f"definition_id = excluded.definition_id RETURNING {GROUP_COLUMNS}",
        new_id("tgrp"),
        workspace_id,
        group_key,
        kind,
        definition_id,
        trigger_index,
        event_id,
        wait,
    )
    assert row is not None
    return row


async def claim_due_groups(conn: asyncpg.Connection, limit: int) -> list[asyncpg.Record]:
    """Groups due now, deleted as they are claimed (the caller's transaction starts their runs)."""
    rows = await conn.fetch(
        "DELETE FROM pending_triggers WHERE id IN (SELECT id FROM pending_triggers "
        "WHERE due_at <= clock_timestamp() ORDER BY due_at LIMIT $1 FOR UPDATE SKIP LOCKED) "
        f"RETURNING {GROUP_COLUMNS}",
        limit,
    )
    return list(rows)


async def take_group(conn: asyncpg.Connection, group_id: str) -> asyncpg.Record | None:
    """A full batch, fired by the event that filled it (already locked by that event's insert)."""
    return await conn.fetchrow(
        f"DELETE FROM pending_triggers WHERE id = $1 RETURNING {GROUP_COLUMNS}", group_id
    )
