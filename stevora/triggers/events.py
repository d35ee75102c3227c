"""Receiving an event: stored once per id, then every matching trigger starts (or groups) a run,
and every run waiting for it by name and `match` is resumed.

Exactly once: the event row is stored first (its id unique per workspace), then processed in one
transaction that locks it, starts the runs its triggers name (idempotency key
`event:<event>:<trigger>`), writes the rows naming them and marks it processed. A second post of
the same id inserts nothing and answers, once the first is processed, with the runs it started.
An event whose API process died before processing it is finished by the workers' pass.
One trigger's failure (a bad input for the definition's schema, a definition
gone) skips that trigger only, inside a savepoint.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import asyncpg
import structlog

from stevora.db import trigger_events as rows
from stevora.db.reads.rows import DbRow
from stevora.definitions.steps import EVENT_SIGNAL_PREFIX
from stevora.definitions.triggers import EventTrigger
from stevora.engine.hints import dispatch_hint
from stevora.errors import StevoraError
from stevora.observability.metrics import TRIGGER_EVENTS
from stevora.triggers import expressions, grouping, waits
from stevora.triggers.starting import run_input, start_run

if TYPE_CHECKING:
    from stevora.runtime import Runtime

log = structlog.get_logger("stevora.triggers")


@dataclass(frozen=True, slots=True)
class IncomingEvent:
    name: str
    data: dict[str, Any]
    id: str | None = None
    ts: datetime | None = None


@dataclass
class Received:
    """One event's answer: the stored row, whether it was a repeat, and its runs."""

    event: DbRow
    deduplicated: bool
    runs: list[DbRow] = field(default_factory=list)


# How long a repeated id's answer waits for the first post to finish processing (polled; no
# connection is held meanwhile) before answering with the runs started so far.
DEDUP_WAIT_S = 10.0
# An event stored but still unprocessed this long after is finished by the workers' pass.
STALE_AFTER_S = 5.0


async def receive(
    rt: Runtime, workspace_id: str, events: list[IncomingEvent], *, source: str = "api"
) -> list[Received]:
    """Store each event and start what it triggers; each event is its own transactions."""
    return [await _receive_one(rt, workspace_id, event, source) for event in events]


async def _receive_one(rt: Runtime, workspace_id: str, event: IncomingEvent, source: str) -> Received:
    row = await rows.insert_event(
        rt.pool,
        workspace_id,
        event_key=event.id,
        name=event.name,
        data=event.data,
        ts=event.ts,
        source=source,
    )
    deduplicated = row is None
    if row is None:
        TRIGGER_EVENTS.labels("deduplicated").inc()
        assert event.id is not None  # a generated id never collides
        row = await rows.event_by_key(rt.pool, workspace_id, event.id)
        assert row is not None
        await _until_processed(rt, row["id"])
    else:
        TRIGGER_EVENTS.labels("received").inc()
        await process(rt, row["id"], workspace_id, row["name"])
        await _until_processed(rt, row["id"])  # at once, unless a worker's pass holds it
    found = await rows.runs_of_events(rt.pool, [row["id"]])
    return Received(row, deduplicated, found.get(row["id"], []))


async def _until_processed(rt: Runtime, event_id: str) -> None:
    deadline = asyncio.get_running_loop().time() + DEDUP_WAIT_S
    while not await rows.is_processed(rt.pool, event_id):
        if asyncio.get_running_loop().time() > deadline:
            return
        await asyncio.sleep(0.02)


async def process(rt: Runtime, event_id: str, workspace_id: str, name: str) -> list[str]:
    """Start the event's triggers and answer the runs waiting for it, once: the event row is
    locked (skipped when someone else holds it) and marked processed in the same transaction.
    Returns the runs dispatched."""
    # Read the definitions the transaction will need first: the cache then answers without a
    # second pool connection while this one is held (no pool starvation under a burst).
    triggers = await rows.triggers_for(rt.pool, workspace_id, name)
    waiting = await rows.runs_waiting_for(rt.pool, workspace_id, EVENT_SIGNAL_PREFIX + name)
    for definition_id in {t["definition_id"] for t in triggers} | {w["definition_id"] for w in waiting}:
        await rt.definitions.get_in_workspace(workspace_id, definition_id)
    wake: list[str] = []
    async with rt.pool.acquire() as conn, conn.transaction():
        locked = await rows.lock_unprocessed(conn, event_id)
        if locked is None:
            return []
        await _start_triggers(rt, conn, locked, wake)
        wake += await waits.resume_waiting(rt, conn, locked)
        await rows.mark_processed(conn, event_id)
    for run_id in wake:
        await dispatch_hint(rt.dispatcher, run_id)
    return wake


async def process_stale(rt: Runtime, *, limit: int = 100) -> int:
    """The workers' pass: finish events stored but never processed (their API process died)."""
    done = 0
    for event_id in await rows.stale_unprocessed(rt.pool, STALE_AFTER_S, limit):
        event = await rows.events_by_ids(rt.pool, [event_id])
        if event:
            await process(rt, event_id, event[0]["workspace_id"], event[0]["name"])
            done += 1
    return done


async def _start_triggers(rt: Runtime, conn: asyncpg.Connection, event: DbRow, wake: list[str]) -> None:
    context = expressions.event_context(event)
    for trigger in await rows.triggers_for(conn, event["workspace_id"], event["name"]):
        spec = EventTrigger.model_validate(trigger["spec"])
        if spec.condition is not None and not expressions.holds(spec.condition, context):
            continue
        try:
            async with conn.transaction():  # a savepoint: this trigger's failure is its own
                if spec.debounce is not None or spec.batch is not None:
                    wake += await grouping.add(rt, conn, trigger, spec, event, context)
                    continue
                run_id = await start_run(
                    rt,
                    conn,
                    workspace_id=event["workspace_id"],
                    definition_id=trigger["definition_id"],
                    run_input=run_input(spec, context),
                    key=f"event:{event['id']}:{trigger['definition_name']}:{trigger['trigger_index']}",
                    event_ids=[event["id"]],
                )
                wake += [run_id] if run_id else []
        except StevoraError as exc:
            log.warning(
                "event_trigger_failed",
                event_id=event["id"],
                definition=trigger["definition_name"],
                trigger_index=trigger["trigger_index"],
                error=exc.message,
            )


__all__ = ["IncomingEvent", "Received", "receive"]
