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
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import asyncpg
import structlog

from stevora.db import definitions as definition_rows
from stevora.db import schedules as rows
from stevora.engine import commands, endings
from stevora.engine.hints import dispatch_hint, dispatch_hints
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
    new = await _new_tick_run(rt, row, tick, found["id"] if found is not None else None, key=key)
    run, created = await new.on(conn)
    await rows.record_tick(conn, row["id"], tick, run["id"], kind)
    if created:
        TRIGGER_RUNS_STARTED.labels("schedule").inc()
    return run["id"], created


async def _new_tick_run(
    rt: Runtime, row: Any, tick: datetime, definition_id: str | None, *, key: str | None = None
) -> commands.NewRun:
    """The run of one tick, checked (its input templated with `{{schedule.scheduledAt}}`)."""
    if definition_id is None:
        raise NotFoundError(
            "The schedule's workflow definition is not found",
            details={"definitionName": row["definition_name"], "version": row["definition_version"]},
        )
    scope = {"schedule": {"id": row["id"], "name": row["name"], "scheduledAt": tick.isoformat()}}
    try:
        run_input = render_typed(dict(row["input"]), input={}, state={}, scope=scope)
    except MissingTemplatePath as exc:
        raise NotFoundError(str(exc), details={"field": exc.field}) from None
    return await commands.prepare_run(
        rt, row["workspace_id"], definition_id, run_input, idempotency_key=key or tick_key(row["id"], tick)
    )


@dataclass(frozen=True, slots=True)
class TickPlan:
    """What a schedule's overlap policy decides at a due pass (`plan_ticks`, no I/O)."""

    start: list[datetime]  # the ticks whose runs start now, in order (the buffered one first)
    cancel_previous: bool  # cancel the schedule's last run first (`cancel_previous`, still active)
    buffered_at: datetime | None
    next_fire_at: datetime | None
    next_due_at: datetime | None
    skipped: int
    late: bool  # the latest due tick was older than the catch-up window allows


def plan_ticks(row: Any, now: datetime, active: bool, grace: timedelta) -> TickPlan:
    """The overlap policy, catch-up window and next tick of one claimed schedule; `active`: its
    last run is still active."""
    start: list[datetime] = []
    skipped = 0
    late = cancel = False
    buffered: datetime | None = row["buffered_at"]
    if buffered is not None and not active:
        start.append(buffered)
        buffered, active = None, True
    fire_at, due_at = row["next_fire_at"], row["next_due_at"]
    if fire_at is not None and due_at is not None and due_at <= now:
        missed = clock_of(row).between(fire_at, now, MAX_CATCHUP_SCAN)
        latest = missed[-1] if missed else fire_at
        skipped += max(len(missed) - 1, 0)
        allowed = timedelta(seconds=row["catchup_window_s"] + row["jitter_s"]) + grace
        if now - latest > allowed:
            skipped += 1
            late = True
        elif active and row["overlap"] == "skip":
            skipped += 1
        elif active and row["overlap"] == "buffer_one":
            if buffered is None:
                buffered = latest
            else:
                skipped += 1
        else:
            cancel = active and row["overlap"] == "cancel_previous"
            start.append(latest)
        fire_at, due_at = next_tick(row, max(latest, now))
    return TickPlan(start, cancel, buffered, fire_at, due_at, skipped, late)


# A pass works the due schedules in transactions of BATCH rows, on LANES concurrent connections
# (one lane's commit overlaps another's statements), until none is due or its time is up. A
# batch is set-based: one statement claims the rows (with their last runs' status and target
# definition), one inserts all their runs, one records the ticks, one advances the schedules, and
# the wake-ups go to the broker in one call; so a tick costs a fraction of a round trip.
BATCH = 200
LANES = 2
# One by one (the fallback and the baseline), a transaction holds fewer rows.
BATCH_ALONE = 25


async def due_pass(rt: Runtime, *, time_budget_s: float | None = None, batched: bool = True) -> list[str]:
    """Handle every schedule due now (this worker's share); returns the runs started.

    `batched=False` handles the claimed schedules one by one, each in its own savepoint (the
    statement pattern before batching): the fallback when a batch fails as a whole, so one
    schedule the database refuses cannot hold the others back, and the bench's baseline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + (
        time_budget_s if time_budget_s is not None else max(2 * rt.settings.trigger_poll_s, 1.0)
    )
    started: list[str] = []

    async def lane() -> None:
        while loop.time() < deadline:
            try:
                wake = await _due_batch(rt, batched=batched)
            except asyncpg.PostgresError as exc:
                if not batched:
                    raise
                log.warning("schedule_batch_failed_one_by_one", error=f"{type(exc).__name__}: {exc}")
                wake = await _due_batch(rt, batched=False)
            if wake is None:
                return
            started.extend(wake)

    await asyncio.gather(*(lane() for _ in range(LANES)))
    return started


async def _due_batch(rt: Runtime, *, batched: bool) -> list[str] | None:
    """One transaction over the due schedules it claims; None when none was due (or all locked)."""
    async with rt.pool.acquire() as conn, conn.transaction():
        now, due = await rows.claim_due(conn, BATCH if batched else BATCH_ALONE)
        if not due:
            return None
        grace = _grace(rt)
        plans = [
            (row, plan_ticks(row, now, row["last_run_status"] in ACTIVE_RUN_STATUSES, grace)) for row in due
        ]
        if batched:
            wake = await _carry_out(rt, conn, now, plans)
        else:
            wake = []
            for row, plan in plans:
                wake += await _carry_out_alone(rt, conn, now, row, plan)
    await dispatch_hints(rt.dispatcher, wake)
    return wake


async def _carry_out(
    rt: Runtime, conn: asyncpg.Connection, now: datetime, plans: list[tuple[Any, TickPlan]]
) -> list[str]:
    """Every plan of a batch in set-based statements; the runs to wake after commit."""
    news: list[commands.NewRun] = []
    ready: list[tuple[Any, TickPlan]] = []
    advances: list[rows.Advance] = []
    for row, plan in plans:
        try:
            news += [await _new_tick_run(rt, row, tick, row["target_definition_id"]) for tick in plan.start]
        except StevoraError as exc:
            advances.append(_failed(row, now, exc))
            continue
        ready.append((row, plan))
    wake: list[str] = []
    for row, plan in ready:
        if plan.cancel_previous:
            wake += await _cancel_previous(conn, row)
    made = await commands.insert_runs(conn, news)
    ticks: list[tuple[str, datetime, str]] = []
    for row, plan in ready:
        keys = [(row["workspace_id"], tick_key(row["id"], tick)) for tick in plan.start]
        started = [made[key] for key in keys if key in made]
        if len(started) < len(plan.start):  # its definition went away since the claim
            advances.append(
                _failed(row, now, NotFoundError("The schedule's workflow definition is not found"))
            )
            continue
        ticks += [(row["id"], tick, run_id) for tick, (run_id, _) in zip(plan.start, started, strict=True)]
        new_runs = [run_id for run_id, created in started if created]
        TRIGGER_RUNS_STARTED.labels("schedule").inc(len(new_runs))
        wake += new_runs
        advances.append(_advance(row, plan, started[-1][0] if started else None))
    await rows.record_ticks(conn, ticks, "tick")
    await rows.advance_many(conn, advances)
    return wake


async def _carry_out_alone(
    rt: Runtime, conn: asyncpg.Connection, now: datetime, row: Any, plan: TickPlan
) -> list[str]:
    """One plan in its own savepoint, statement by statement; the runs to wake after commit."""
    wake: list[str] = []
    try:
        async with conn.transaction():
            if plan.cancel_previous:
                wake += await _cancel_previous(conn, row)
            last_run: str | None = None
            for tick in plan.start:
                last_run, created = await start_tick_run(rt, conn, row, tick, kind="tick")
                wake += [last_run] if created else []
            await rows.advance_many(conn, [_advance(row, plan, last_run)])
    except StevoraError as exc:
        await rows.advance_many(conn, [_failed(row, now, exc)])
        return []
    return wake


def _advance(row: Any, plan: TickPlan, last_run: str | None) -> rows.Advance:
    SCHEDULE_TICKS.labels("run").inc(len(plan.start))
    SCHEDULE_TICKS.labels("skipped").inc(plan.skipped)
    if plan.late:
        SCHEDULE_TICKS.labels("late").inc()
    return rows.Advance(
        row["id"],
        plan.next_fire_at,
        plan.next_due_at,
        plan.buffered_at,
        last_run,
        len(plan.start),
        plan.skipped,
    )


def _failed(row: Any, now: datetime, exc: StevoraError) -> rows.Advance:
    """A schedule whose tick could not start a run (its definition or input is wrong): the tick
    is skipped and counted, the next one is tried."""
    log.warning("schedule_tick_failed", schedule_id=row["id"], error=exc.message)
    SCHEDULE_TICKS.labels("skipped").inc()
    fire, due_at = next_tick(row, now)
    return rows.Advance(row["id"], fire, due_at, None, None, 0, 1)


def _grace(rt: Runtime) -> timedelta:
    """How late a tick may be and still count as on time: a few polls of the due pass."""
    return timedelta(seconds=max(3 * rt.settings.trigger_poll_s, 2.0))


async def _cancel_previous(conn: asyncpg.Connection, row: Any) -> list[str]:
    try:
        async with conn.transaction():
            ended = await endings.cancel_run(conn, row["last_run_id"])
    except (InvalidStateTransition, NotFoundError):
        return []  # it ended meanwhile: nothing to cancel
    return list(ended.dispatch)


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
    async with rt.pool.acquire() as conn, conn.transaction():
        found = await definition_rows.find_version(
            conn,
            row["workspace_id"],
            row["definition_name"],
            None if row["definition_version"] == LATEST else row["definition_version"],
        )
        news = [await _new_tick_run(rt, row, tick, found["id"] if found else None) for tick in ticks]
        made = await commands.insert_runs(conn, news)
        if len(made) < len(news):
            raise NotFoundError("The schedule's workflow definition is not found")
        started = [(tick, made[(row["workspace_id"], tick_key(row["id"], tick))]) for tick in ticks]
        await rows.record_ticks(
            conn, [(row["id"], tick, run_id) for tick, (run_id, _) in started], "backfill"
        )
    wake = [run_id for _, (run_id, created) in started if created]
    TRIGGER_RUNS_STARTED.labels("schedule").inc(len(wake))
    await dispatch_hints(rt.dispatcher, wake)
    return [(tick, run_id) for tick, (run_id, _) in started]


def upcoming(row: Any, now: datetime, count: int = 5) -> list[datetime]:
    """The next `count` ticks from now (or from `startAt` when later); also while paused."""
    return clock_of(row).upcoming(now, count)
