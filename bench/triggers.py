"""Triggers (docs/triggers.md): events accepted per second and event → run start latency; many
`intervalS: 1` schedules kept by two real worker processes.

    .venv/bin/python -m bench.triggers [--events 500] [--concurrency 8] [--schedules 1000]
                                       [--seconds 15] [--processes 2] [--counted 1000]

Events: `--events` events are received by `stevora.triggers.events.receive` (the code behind
`POST /v1/events`, without HTTP) from `--concurrency` concurrent senders, each starting one run of
a one-step definition; the workers (RabbitMQ) execute the runs. Printed: events accepted per
second, and from each event's receipt to its run's `started_at` (both on the database's clock),
p50 and p99. Then the same number of events again with one id each sent twice (the repeats: what
deduplication costs).

Round trips per tick: `--counted` schedules fall due at once and one in-process due pass handles
them, counted by `bench.counts.Probe` (statements, and a round trip more for each one not yet
prepared): once one by one (`due_pass(batched=False)`: the statement pattern before batching, the
baseline) and once set-based (the workers' pass), each twice (the second pass is printed: the
statements are prepared by then, as in a long-running worker); with the pass's in-process ticks/s.

Schedules: `--schedules` schedules of `intervalS: 1` (overlap `allow`) for `--seconds`, with
`--processes` workers doing the due pass (STEVORA_TRIGGER_POLL_S 0.5). Printed: ticks run per
second against the ticks due, how late a tick's run was created after its tick (p50, p99), ticks
missed (no run: skipped as late), and ticks doubled (two runs for one schedule and tick; the
idempotency key makes this 0 by construction, checked from the rows). Bounded: the whole bench
takes about `--seconds` + 60 s.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import secrets
import time
from typing import Any

from bench.common import bench_database_url, new_workspace, pct
from bench.counts import Counts, Probe
from stevora.definitions.triggers import ScheduleTiming
from stevora.engine import commands
from stevora.engine.brokers import build_broker
from stevora.engine.dispatch import DramatiqDispatcher, RecordingDispatcher
from stevora.logging import configure_logging
from stevora.runtime import Runtime
from stevora.settings import Settings
from stevora.triggers import schedule_store, schedules
from stevora.triggers.events import IncomingEvent, receive
from tests.conftest import create_definition
from tests.e2e.workerproc import WorkerProcess

BROKER = "amqp://guest:guest@127.0.0.1:5672/"
STEP = [{"name": "pause", "type": "wait", "durationMs": 0}]


async def _send_all(rt: Runtime, ws: str, events: list[IncomingEvent], concurrency: int) -> float:
    queue = list(events)

    async def sender() -> None:
        while queue:
            await receive(rt, ws, [queue.pop()])

    started = time.perf_counter()
    await asyncio.gather(*(sender() for _ in range(concurrency)))
    return time.perf_counter() - started


async def _bench_events(rt: Runtime, ws: str, args: argparse.Namespace) -> None:
    await rt.pool.execute(
        "INSERT INTO event_triggers (workspace_id, definition_name, trigger_index, definition_id, event_name, spec) "
        "SELECT $1::text, name, 0, id, 'bench.event', '{\"event\": \"bench.event\"}'::jsonb "
        "FROM workflow_definitions WHERE workspace_id = $1::text AND name = 'evented'",
        ws,
    )
    events = [IncomingEvent("bench.event", {"n": n}, id=f"e{n}") for n in range(args.events)]
    wall = await _send_all(rt, ws, events, args.concurrency)
    repeats = await _send_all(rt, ws, events, args.concurrency)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        left = await rt.pool.fetchval(
            "SELECT count(*) FROM workflow_runs WHERE workspace_id = $1 AND started_at IS NULL", ws
        )
        if not left:
            break
        await asyncio.sleep(0.5)
    lat = [
        float(r["ms"])
        for r in await rt.pool.fetch(
            "SELECT extract(epoch FROM r.started_at - e.received_at) * 1000 AS ms FROM trigger_events e "
            "JOIN trigger_event_runs x ON x.event_id = e.id JOIN workflow_runs r ON r.id = x.run_id "
            "WHERE e.workspace_id = $1 AND r.started_at IS NOT NULL",  # the probe run has no event
            ws,
        )
    ]
    runs = await rt.pool.fetchval(
        "SELECT count(*) FROM workflow_runs WHERE workspace_id = $1 AND idempotency_key LIKE 'event:%'", ws
    )
    print(
        f"events: {args.events} sent by {args.concurrency} senders in {wall:.2f} s = {args.events / wall:.0f} events/s"
    )
    print(f"        the same ids again (deduplicated): {args.events / repeats:.0f} events/s")
    print(f"        runs started: {runs} (one per event id), {len(lat)} started by a worker within 60 s")
    print(f"        event received -> run started: p50 {pct(lat, 0.5):.0f} ms, p99 {pct(lat, 0.99):.0f} ms")


async def _bench_schedules(rt: Runtime, ws: str, args: argparse.Namespace) -> None:
    timing = ScheduleTiming(interval_s=1, overlap="allow", catchup_window_s=0)
    for _ in range(args.schedules):
        await schedule_store.create(
            rt, ws, timing, name=None, definition_id=None, definition_name="scheduled", version="latest"
        )
    opened = await rt.pool.fetchval("SELECT clock_timestamp()")
    await asyncio.sleep(args.seconds)
    closed = await rt.pool.fetchval("SELECT clock_timestamp()")
    await rt.pool.execute("UPDATE schedules SET paused = true WHERE workspace_id = $1", ws)
    rows = await rt.pool.fetch(
        "SELECT extract(epoch FROM t.created_at - t.scheduled_at) * 1000 AS late_ms FROM schedule_ticks t "
        "JOIN schedules s ON s.id = t.schedule_id "
        "WHERE s.workspace_id = $1 AND t.scheduled_at BETWEEN $2 AND $3",
        ws,
        opened,
        closed,
    )
    late = [float(r["late_ms"]) for r in rows]
    doubled = await rt.pool.fetchval(
        "SELECT count(*) FROM (SELECT t.schedule_id, t.scheduled_at FROM schedule_ticks t "
        "JOIN schedules s ON s.id = t.schedule_id WHERE s.workspace_id = $1 "
        "GROUP BY 1, 2 HAVING count(DISTINCT t.run_id) > 1) d",
        ws,
    )
    runs = await rt.pool.fetchval(
        "SELECT count(*) FROM workflow_runs WHERE workspace_id = $1 AND idempotency_key LIKE 'schedule:%'", ws
    )
    ticks = await rt.pool.fetchval(
        "SELECT count(*) FROM schedule_ticks t JOIN schedules s ON s.id = t.schedule_id WHERE s.workspace_id = $1",
        ws,
    )
    skipped = await rt.pool.fetchval("SELECT sum(ticks_skipped) FROM schedules WHERE workspace_id = $1", ws)
    seconds = (closed - opened).total_seconds()
    due = args.schedules * seconds
    print(f"schedules: {args.schedules} x intervalS 1 for {seconds:.1f} s on {args.processes} workers")
    print(
        f"        ticks run in the window: {len(late)} of ~{due:.0f} due = {len(late) / seconds:.0f} ticks/s"
    )
    print(f"        tick -> its run committed: p50 {pct(late, 0.5):.0f} ms, p99 {pct(late, 0.99):.0f} ms")
    print(f"        ticks skipped as late: {skipped}; doubled: {doubled}; runs {runs} = tick rows {ticks}")


async def _bench_round_trips(url: str, args: argparse.Namespace) -> None:
    """Round trips per tick of the due pass, one by one (the baseline) against set-based."""
    rt = await Runtime.start(Settings(database_url=url), dispatcher=RecordingDispatcher())
    probe = Probe()
    try:
        ws = await new_workspace(rt.pool)
        await create_definition(rt, ws, {"name": "counted", "version": "1", "steps": STEP})
        # A wide catch-up window: a pass slowed by the probe must not skip ticks as late (fewer runs
        # would make the per-tick counts look larger).
        timing = ScheduleTiming(interval_s=3600, overlap="allow", catchup_window_s=3600, paused=True)
        for _ in range(args.counted):
            await schedule_store.create(
                rt, ws, timing, name=None, definition_id=None, definition_name="counted", version="latest"
            )
        print(f"due pass, {args.counted} schedules due at once, in process:")
        for batched, label in ((False, "one by one (before)"), (True, "set-based (now)")):
            for _warm in range(2):  # the first warms the statement caches up
                await rt.pool.execute(
                    "UPDATE schedules SET paused = false, next_fire_at = clock_timestamp() - interval '0.1 s', "
                    "next_due_at = clock_timestamp() - interval '0.1 s' WHERE workspace_id = $1",
                    ws,
                )
                probe.counts = Counts()
                probe.start()
                try:
                    started = len(await schedules.due_pass(rt, time_budget_s=60, batched=batched))
                finally:
                    probe.stop()
                counted = probe.counts
                await rt.pool.execute("UPDATE schedules SET paused = true WHERE workspace_id = $1", ws)
                wall = time.perf_counter()
                await rt.pool.execute(
                    "UPDATE schedules SET paused = false, next_fire_at = clock_timestamp() - interval '0.1 s', "
                    "next_due_at = clock_timestamp() - interval '0.1 s' WHERE workspace_id = $1",
                    ws,
                )
                timed = len(await schedules.due_pass(rt, time_budget_s=60, batched=batched))
                wall = time.perf_counter() - wall
                await rt.pool.execute("UPDATE schedules SET paused = true WHERE workspace_id = $1", ws)
            assert started == timed == args.counted, (started, timed)  # every schedule ticked once
            print(
                f"        {label:>20}: {counted.round_trips / started:.2f} round trips per tick "
                f"({counted.statements / started:.2f} statements, {counted.commits / started:.3f} commits), "
                f"{timed / wall:.0f} ticks/s in one process (no probe)"
            )
        doubled = await rt.pool.fetchval(
            "SELECT count(*) FROM (SELECT idempotency_key FROM workflow_runs WHERE workspace_id = $1 "
            "GROUP BY 1 HAVING count(*) > 1) d",
            ws,
        )
        print(f"        doubled keys: {doubled}")
        # Its runs were never sent to a broker: ended here, so the workers' recovery sweep does
        # not pick them up and run thousands of them under the figures that follow.
        await rt.pool.execute(
            "UPDATE workflow_runs SET status = 'CANCELLED', completed_at = now() WHERE workspace_id = $1", ws
        )
    finally:
        await rt.close()


async def _workers_ready(rt: Runtime, ws: str) -> None:
    """Wait until a worker has started a run (start-up takes seconds on a loaded machine), so the
    figures measure triggers, not imports."""
    probe = await rt.pool.fetchval(
        "SELECT id FROM workflow_definitions WHERE workspace_id = $1 AND name = 'scheduled'", ws
    )
    run, _ = await commands.create_run(rt, ws, probe, {})
    for _ in range(1200):
        if await rt.pool.fetchval("SELECT started_at FROM workflow_runs WHERE id = $1", run["id"]):
            return
        await asyncio.sleep(0.1)
    raise SystemExit("no worker started a run within 120 s")


async def main(args: argparse.Namespace, url: str) -> None:
    await _bench_round_trips(url, args)
    queue = f"bench-triggers-{secrets.token_hex(3)}"
    settings = Settings(database_url=url, broker_url=BROKER, queue_name=queue)
    broker = build_broker(BROKER)
    rt = await Runtime.start(settings, dispatcher=DramatiqDispatcher(broker, queue))
    workers: list[WorkerProcess] = []
    try:
        ws = await new_workspace(rt.pool)
        for name in ("evented", "scheduled"):
            await create_definition(rt, ws, {"name": name, "version": "1", "steps": STEP})
        env: dict[str, Any] = {"STEVORA_TRIGGER_POLL_S": "0.5", "STEVORA_SWEEP_INTERVAL_S": "1"}
        workers = [WorkerProcess(url, BROKER, queue, extra_env=env) for _ in range(args.processes)]
        await _workers_ready(rt, ws)
        await _bench_events(rt, ws, args)
        ws2 = await new_workspace(rt.pool)
        await create_definition(rt, ws2, {"name": "scheduled", "version": "1", "steps": STEP})
        await _bench_schedules(rt, ws2, args)
    finally:
        for worker in workers:
            worker.stop()
        await rt.close()
        broker.close()


if __name__ == "__main__":
    configure_logging(Settings(log_level="WARNING", log_format="console"))
    logging.getLogger("pika").setLevel(logging.CRITICAL)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--schedules", type=int, default=1000)
    parser.add_argument("--counted", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--processes", type=int, default=2)
    asyncio.run(main(parser.parse_args(), bench_database_url("triggers")))
