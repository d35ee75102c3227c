"""Schedules: the workers' due pass, and the runs a tick, "trigger now" or a backfill starts.

Exactly one run per tick: a tick's run has the idempotency key `schedule:<id>:<tick>`, and the
run, its `schedule_ticks` row and the schedule's next tick are written in one transaction while
the schedule row is locked (`FOR UPDATE SKIP LOCKED`: any number of workers share the pass, none
is a leader). A worker that dies mid-pass rolls back; the next pass computes the same tick, and
the key makes a run already inserted the same run. Dueness is read off the database's clock, so
workers' clock skew cannot make a tick early or double.

Catch-up: the ticks missed while no worker ran (since `next_fire_at`) make one run, carrying the
latest missed tick, when that tick is at most `catchupWindowS` (plus jitter and the poll grace)
old; the older ones are skipped and counted (`ticksSkipped`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import asyncpg
import structlog

from stevora.db import definitions as definition_rows
from stevora.db import schedules as rows
from stevora.engine import commands, endings
from stevora.engine.hints import dispatch_hint
from stevora.errors import InvalidStateTransition, NotFoundError, StevoraError, ValidationError
from stevora.observability.metrics import SCHEDULE_TICKS, TRIGGER_RUNS_STARTED
from stevora.statuses import ACTIVE_RUN_STATUSES
from stevora.templating import MissingTemplatePath, render_typed
from stevora.triggers.timing import Clock, jitter

if TYPE_CHECKING:
    from stevora.runtime import Runtime

log = structlog.get_logger("stevora.triggers")

MAX_BACKFILL_TICKS = 1000
# Ticks counted one by one after downtime; beyond this the skipped count is a lower bound.
MAX_CATCHUP_SCAN = 10_000
LATEST = "latest"


def clock_of(row: Any) -> Clock:
    return Clock(
        cron=row["cron"],
        interval_s=row["interval_s"],
        timezone=row["timezone"],
        anchor=row["start_at"] or row["created_at"],
        start_at=row["start_at"],
        end_at=row["end_at"],
    )


def next_tick(row: Any, after: datetime) -> tuple[datetime | None, datetime | None]:
    """(next_fire_at, next_due_at) for the first tick after `after`."""
    tick = clock_of(row).next_after(after)
    if tick is None:
        return None, None
    return tick, tick + jitter(row["id"], tick, row["jitter_s"])


def tick_key(schedule_id: str, tick: datetime) -> str:
    return f"schedule:{schedule_id}:{tick.astimezone(UTC).isoformat()}"


@dataclass
class _Pass:
    """What one due pass did: runs to dispatch after commit."""

    wake: list[str] = field(default_factory=list)


async def start_tick_run(
    rt: Runtime, conn: asyncpg.Connection, row: Any, tick: datetime, *, kind: str, key: str | None = None
) -> tuple[str, bool]:
    """Insert the run of one tick in the caller's transaction; (run id, created). A tick already
    run returns its run (the idempotency key), so calling this twice never makes two."""
    found = await definition_rows.find_version(
        conn,
        row["workspace_id"],
        row["definition_name"],
        None if row["definition_version"] == LATEST else row["definition_version"],
    )
    if found is None:
        raise NotFoundError(
            "The schedule's workflow definition is not found",
            details={"definitionName": row["definition_name"], "version": row["definition_version"]},
        )
    scope = {"schedule": {"id": row["id"], "name": row["name"], "scheduledAt": tick.isoformat()}}
    try:
        run_input = render_typed(dict(row["input"]), input={}, state={}, scope=scope)
    except MissingTemplatePath as exc:
        raise NotFoundError(str(exc), details={"field": exc.field}) from None
    run, created = await commands.create_run(
        rt,
        row["workspace_id"],
        found["id"],
        run_input,
        idempotency_key=key or tick_key(row["id"], tick),
        conn=conn,
    )
    await rows.record_tick(conn, row["id"], tick, run["id"], kind)
    if created:
        TRIGGER_RUNS_STARTED.labels("schedule").inc()
    return run["id"], created


# A pass works the due schedules in short transactions of BATCH rows, on LANES concurrent
# connections (the database round trips overlap), until none is due or its time is up; so the
# row locks are held briefly and many workers share a large backlog.
BATCH = 25
LANES = 3


async def due_pass(rt: Runtime, *, time_budget_s: float | None = None) -> list[str]:
    """Handle every schedule due now (this worker's share); returns the runs started."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + (
        time_budget_s if time_budget_s is not None else max(2 * rt.settings.trigger_poll_s, 1.0)
    )
    started: list[str] = []

    async def lane() -> None:
        while loop.time() < deadline:
            wake = await _due_batch(rt)
            if wake is None:
                return
            started.extend(wake)

    await asyncio.gather(*(lane() for _ in range(LANES)))
    return started


async def _due_batch(rt: Runtime) -> list[str] | None:
    """One transaction over up to BATCH due schedules; None when none was due (or all locked)."""
    done = _Pass()
    async with rt.pool.acquire() as conn, conn.transaction():
        now, due = await rows.claim_due(conn, BATCH)
        if not due:
            return None
        for row in due:
            try:
                async with conn.transaction():  # a savepoint: one schedule's failure is its own
                    await _handle(rt, conn, row, now, done)
            except StevoraError as exc:
                log.warning("schedule_tick_failed", schedule_id=row["id"], error=exc.message)
                SCHEDULE_TICKS.labels("skipped").inc()
                fire, due_at = next_tick(row, now)
                await rows.advance(
                    conn, row["id"], next_fire_at=fire, next_due_at=due_at, buffered_at=None,
                    last_run_id=None, ran=0, skipped=1,
                )  # fmt: skip
    for run_id in done.wake:
        await dispatch_hint(rt.dispatcher, run_id)
    return done.wake


async def _handle(rt: Runtime, conn: asyncpg.Connection, row: Any, now: datetime, done: _Pass) -> None:
    ran = skipped = 0
    last_run: str | None = None
    buffered: datetime | None = row["buffered_at"]
    active = False
    if row["overlap"] != "allow" or buffered is not None:  # `allow` never asks
        active = await rows.run_status(conn, row["last_run_id"]) in ACTIVE_RUN_STATUSES
    if buffered is not None and not active:
        last_run, created = await start_tick_run(rt, conn, row, buffered, kind="tick")
        done.wake += [last_run] if created else []
        ran, buffered, active = ran + 1, None, True
    fire_at, due_at = row["next_fire_at"], row["next_due_at"]
    if fire_at is not None and due_at is not None and due_at <= now:
        missed = clock_of(row).between(fire_at, now, MAX_CATCHUP_SCAN)
        latest = missed[-1] if missed else fire_at
        skipped += max(len(missed) - 1, 0)
        lateness = now - latest
        allowed = timedelta(seconds=row["catchup_window_s"] + row["jitter_s"]) + _grace(rt)
        if lateness > allowed:
            skipped += 1
            SCHEDULE_TICKS.labels("late").inc()
        elif active and row["overlap"] == "skip":
            skipped += 1
        elif active and row["overlap"] == "buffer_one":
            if buffered is None:
                buffered = latest
            else:
                skipped += 1
        else:
            if active and row["overlap"] == "cancel_previous":
                await _cancel_previous(conn, row, done)
            last_run, created = await start_tick_run(rt, conn, row, latest, kind="tick")
            done.wake += [last_run] if created else []
            ran += 1
        fire_at, due_at = next_tick(row, max(latest, now))
    SCHEDULE_TICKS.labels("run").inc(ran)
    SCHEDULE_TICKS.labels("skipped").inc(skipped)
    await rows.advance(
        conn,
        row["id"],
        next_fire_at=fire_at,
        next_due_at=due_at,
        buffered_at=buffered,
        last_run_id=last_run,
        ran=ran,
        skipped=skipped,
    )


def _grace(rt: Runtime) -> timedelta:
    """How late a tick may be and still count as on time: a few polls of the due pass."""
    return timedelta(seconds=max(3 * rt.settings.trigger_poll_s, 2.0))


async def _cancel_previous(conn: asyncpg.Connection, row: Any, done: _Pass) -> None:
    try:
        async with conn.transaction():
            ended = await endings.cancel_run(conn, row["last_run_id"])
        done.wake += ended.dispatch
    except (InvalidStateTransition, NotFoundError):
        pass  # it ended meanwhile: nothing to cancel


async def trigger_now(rt: Runtime, row: Any) -> tuple[str, datetime]:
    """Start one run now (`POST .../trigger`), outside the tick sequence and its overlap policy."""
    async with rt.pool.acquire() as conn, conn.transaction():
        now = await rows.database_now(conn)
        run_id, _ = await start_tick_run(
            rt, conn, row, now, kind="manual", key=f"schedule:{row['id']}:manual:{now.isoformat()}"
        )
        await rows.set_last_run(conn, row["id"], run_id)
    await dispatch_hint(rt.dispatcher, run_id)
    return run_id, now


async def backfill(rt: Runtime, row: Any, first: datetime, last: datetime) -> list[tuple[datetime, str]]:
    """Runs for the ticks in [first, last] (each once: a tick already run keeps its run)."""
    ticks = clock_of(row).between(first, last, MAX_BACKFILL_TICKS + 1)
    if len(ticks) > MAX_BACKFILL_TICKS:
        raise ValidationError.from_problems(
            [{"path": "to", "message": f"the range holds more than {MAX_BACKFILL_TICKS} ticks"}]
        )
    started: list[tuple[datetime, str]] = []
    wake: list[str] = []
    async with rt.pool.acquire() as conn, conn.transaction():
        for tick in ticks:
            run_id, created = await start_tick_run(rt, conn, row, tick, kind="backfill")
            started.append((tick, run_id))
            wake += [run_id] if created else []
    for run_id in wake:
        await dispatch_hint(rt.dispatcher, run_id)
    return started


def upcoming(row: Any, now: datetime, count: int = 5) -> list[datetime]:
    """The next `count` ticks from now (or from `startAt` when later); also while paused."""
    return clock_of(row).upcoming(now, count)
