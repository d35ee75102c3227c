"""Debounce and batch: events collected in a durable group (`pending_triggers`) until it fires.

* debounce `{key, periodMs}`: events whose `key` expression has one value share a group; each
  pushes its due time to `periodMs` after itself, and the run gets the last event's data.
* batch `{maxSize, timeoutMs}`: a group fills up to `maxSize` events (then fires at once, in the
  event's transaction) or fires `timeoutMs` after its first event; the run's input is
  `{"events": [{name, data, id, ts}, ...]}`.

A due group is deleted by the workers' pass in the transaction that starts its run (idempotency
key `trigger-group:<group id>`), so it fires once whichever worker takes it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

import asyncpg
import structlog

from stevora.db import trigger_events as event_rows
from stevora.db import trigger_groups as rows
from stevora.db.reads.rows import DbRow
from stevora.definitions.triggers import EventTrigger
from stevora.engine.hints import dispatch_hint
from stevora.errors import StevoraError
from stevora.triggers import expressions
from stevora.triggers.starting import run_input, start_run

if TYPE_CHECKING:
    from stevora.runtime import Runtime

log = structlog.get_logger("stevora.triggers")


async def add(
    rt: Runtime,
    conn: asyncpg.Connection,
    trigger: DbRow,
    spec: EventTrigger,
    event: DbRow,
    context: dict[str, Any],
) -> list[str]:
    """Put the event in its group; the runs to dispatch when that filled a batch."""
    base = f"{event['workspace_id']}|{trigger['definition_name']}|{trigger['trigger_index']}"
    if spec.debounce is not None:
        key = expressions.key_of(spec.debounce.key, context)
        await rows.add_to_group(
            conn, event["workspace_id"], f"{base}|debounce|{key}", "debounce", trigger["definition_id"],
            trigger["trigger_index"], event["id"], timedelta(milliseconds=spec.debounce.period_ms),
        )  # fmt: skip
        return []
    assert spec.batch is not None
    group = await rows.add_to_group(
        conn, event["workspace_id"], f"{base}|batch", "batch", trigger["definition_id"],
        trigger["trigger_index"], event["id"], timedelta(milliseconds=spec.batch.timeout_ms),
    )  # fmt: skip
    if len(group["event_ids"]) < spec.batch.max_size:
        return []
    taken = await rows.take_group(conn, group["id"])
    assert taken is not None
    run_id = await _fire(rt, conn, taken, spec)
    return [run_id] if run_id else []


async def fire_due(rt: Runtime, *, limit: int = 200) -> list[str]:
    """Fire every group due now (this worker's share); the runs started."""
    wake: list[str] = []
    async with rt.pool.acquire() as conn, conn.transaction():
        for group in await rows.claim_due_groups(conn, limit):
            trigger = await event_rows.trigger_of(
                conn, group["workspace_id"], group["definition_id"], group["trigger_index"]
            )
            spec = EventTrigger.model_validate(trigger["spec"]) if trigger is not None else None
            try:
                async with conn.transaction():
                    run_id = await _fire(rt, conn, group, spec)
            except StevoraError as exc:
                log.warning("trigger_group_failed", group_id=group["id"], error=exc.message)
                continue
            wake += [run_id] if run_id else []
    for run_id in wake:
        await dispatch_hint(rt.dispatcher, run_id)
    return wake


async def _fire(rt: Runtime, conn: asyncpg.Connection, group: DbRow, spec: EventTrigger | None) -> str | None:
    event_ids = [str(e) for e in group["event_ids"]]
    stored = {e["id"]: e for e in await event_rows.events_by_ids(conn, event_ids)}
    events = [expressions.event_context(stored[i]) for i in event_ids if i in stored]  # arrival order
    if not events:
        return None
    if group["kind"] == "batch":
        run_in: dict[str, Any] = {"events": events}
    else:
        last = events[-1]
        run_in = run_input(spec, last) if spec is not None else dict(last["data"])
    return await start_run(
        rt,
        conn,
        workspace_id=group["workspace_id"],
        definition_id=group["definition_id"],
        run_input=run_in,
        key=f"trigger-group:{group['id']}",
        event_ids=event_ids,
    )
