"""Creating, changing and reading schedules (the API's and a definition's `schedule`).

A change to the clock (cron, interval, zone, start, end) or a resume recomputes the next tick
from now: ticks missed while paused are not caught up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import asyncpg

from stevora.db import definitions as definition_rows
from stevora.db import schedules as rows
from stevora.db.reads.rows import DbRow
from stevora.definitions.triggers import ScheduleTiming
from stevora.errors import ConflictError, NotFoundError, ValidationError
from stevora.ids import new_id
from stevora.triggers import schedules

if TYPE_CHECKING:
    from stevora.runtime import Runtime

CLOCK_FIELDS = frozenset({"cron", "interval_s", "timezone", "start_at", "end_at", "jitter_s"})
TIMING_FIELDS = (
    "cron", "interval_s", "timezone", "input", "overlap", "catchup_window_s", "jitter_s",
    "start_at", "end_at", "paused",
)  # fmt: skip


async def resolve_definition(
    conn: asyncpg.Connection, workspace_id: str, definition_id: str | None, name: str | None, version: str
) -> tuple[str, str]:
    """(definition name, version or "latest") of a schedule's target, which must exist now."""
    if definition_id is not None:
        row = await definition_rows.get(conn, definition_id)
        if row is None or row["workspace_id"] != workspace_id:
            raise NotFoundError("Workflow definition not found", details={"definitionId": definition_id})
        return row["name"], row["version"]
    assert name is not None
    found = await definition_rows.find_version(
        conn, workspace_id, name, None if version == schedules.LATEST else version
    )
    if found is None:
        raise NotFoundError(
            "Workflow definition not found", details={"definitionName": name, "version": version}
        )
    return name, version


async def create(
    rt: Runtime,
    workspace_id: str,
    timing: ScheduleTiming,
    *,
    name: str | None,
    definition_id: str | None,
    definition_name: str | None,
    version: str,
    source: str = "api",
) -> DbRow:
    async with rt.pool.acquire() as conn, conn.transaction():
        def_name, def_version = await resolve_definition(
            conn, workspace_id, definition_id, definition_name, version
        )
        now = await rows.database_now(conn)
        fields: dict[str, Any] = {k: getattr(timing, k) for k in TIMING_FIELDS}
        fields.update(
            name=name or new_id("schedule"),
            definition_name=def_name,
            definition_version=def_version,
            source=source,
            created_at=now,
        )
        row = await rows.insert_schedule(conn, workspace_id, fields)  # not due until the update below
        if row is None:
            raise ConflictError(
                f"A schedule named '{fields['name']}' already exists", details={"name": fields["name"]}
            )
        fire, due = schedules.next_tick(row, now)
        made: DbRow | None = await rows.update_schedule(
            conn, row["id"], {"next_fire_at": fire, "next_due_at": due}
        )
        assert made is not None  # inserted just now, in this transaction
        return made


async def update(rt: Runtime, workspace_id: str, schedule_id: str, changes: dict[str, Any]) -> DbRow:
    """Apply `changes` (snake_case fields of ScheduleUpdate that were sent), checked as a whole."""
    async with rt.pool.acquire() as conn, conn.transaction():
        row = await rows.get_schedule(conn, workspace_id, schedule_id, lock=True)
        if row is None:
            raise NotFoundError("Schedule not found", details={"scheduleId": schedule_id})
        merged = {k: row[k] for k in TIMING_FIELDS} | {k: v for k, v in changes.items() if k in TIMING_FIELDS}
        try:
            timing = ScheduleTiming.model_validate(merged)
        except ValueError as exc:
            raise ValidationError(f"Invalid schedule: {exc}") from None
        sets: dict[str, Any] = {k: getattr(timing, k) for k in TIMING_FIELDS}
        if "name" in changes and changes["name"] is not None:
            sets["name"] = changes["name"]
        if changes.get("version") is not None:
            _, sets["definition_version"] = await resolve_definition(
                conn, workspace_id, None, row["definition_name"], changes["version"]
            )
        resumed = row["paused"] and not timing.paused
        if resumed or CLOCK_FIELDS & changes.keys():
            now = await rows.database_now(conn)
            fire, due = schedules.next_tick(dict(row) | sets, now)
            sets.update(next_fire_at=fire, next_due_at=due, buffered_at=None)
        try:
            async with conn.transaction():
                updated: DbRow | None = await rows.update_schedule(conn, schedule_id, sets)
        except asyncpg.UniqueViolationError:
            raise ConflictError(f"A schedule named '{sets['name']}' already exists") from None
        assert updated is not None
        return updated


async def get(rt: Runtime, workspace_id: str, schedule_id: str) -> DbRow:
    row: DbRow | None = await rows.get_schedule(rt.pool, workspace_id, schedule_id)
    if row is None:
        raise NotFoundError("Schedule not found", details={"scheduleId": schedule_id})
    return row


async def sync_from_definition(
    conn: asyncpg.Connection, workspace_id: str, name: str, timing: ScheduleTiming | None
) -> None:
    """Keep the schedule a definition's `schedule` declares in step with its newest version:
    created, changed, or deleted when the new version has none. Its name is the definition's."""
    if timing is None:
        await rows.delete_definition_schedule(conn, workspace_id, name)
        return
    existing = await rows.get_by_name(conn, workspace_id, name)
    now = await rows.database_now(conn)
    fields: dict[str, Any] = {k: getattr(timing, k) for k in TIMING_FIELDS}
    fields.update(definition_name=name, definition_version=schedules.LATEST)
    if existing is None:
        row = await rows.insert_schedule(conn, workspace_id, fields | {"name": name, "source": "definition"})
        if row is None:
            return
        existing = row
    elif existing["source"] != "definition":
        raise ConflictError(
            f"A schedule named '{name}' already exists and was made through the API; rename or delete it",
            details={"field": "schedule", "scheduleId": existing["id"]},
        )
    else:
        clock_same = all(existing[k] == fields[k] for k in CLOCK_FIELDS)
        if clock_same:
            await rows.update_schedule(conn, existing["id"], fields)
            return
        existing = await rows.update_schedule(conn, existing["id"], fields)
        assert existing is not None
    fire, due = schedules.next_tick(existing, now)
    await rows.update_schedule(conn, existing["id"], {"next_fire_at": fire, "next_due_at": due})
