"""Triggers with real worker processes on a real broker (both brokers): two workers racing over an
`intervalS: 2` schedule make one run per tick; `skip` never overlaps a slow run; a paused schedule
makes none; workers stopped for three ticks catch up with exactly one run (`buffer_one`); a
debounce burst becomes one run, fired by a worker's pass."""

from __future__ import annotations

import asyncio
import itertools
from datetime import timedelta
from typing import Any

import pytest

from stevora.definitions.triggers import ScheduleTiming
from stevora.triggers import schedule_store
from stevora.triggers.events import IncomingEvent, receive
from tests.conftest import create_definition
from tests.e2e.conftest import BrokerSetup
from tests.e2e.workerproc import WorkerProcess

pytestmark = [pytest.mark.broker, pytest.mark.timeout(180)]
FAST = {"STEVORA_TRIGGER_POLL_S": "0.2"}
QUICK = [{"name": "pause", "type": "wait", "durationMs": 0}]


def _worker(setup: BrokerSetup) -> WorkerProcess:
    return WorkerProcess(setup.rt.settings.database_url, setup.url, setup.queue, extra_env=FAST)


async def _schedule(setup: BrokerSetup, name: str, **timing: Any) -> str:
    row = await schedule_store.create(
        setup.rt,
        setup.workspace_id,
        ScheduleTiming.model_validate(timing),
        name=None,
        definition_id=None,
        definition_name=name,
        version="latest",
    )
    return str(row["id"])


async def _ticks(setup: BrokerSetup, schedule_id: str) -> list[Any]:
    return list(
        await setup.rt.pool.fetch(
            "SELECT t.scheduled_at, r.id, r.status, r.started_at, r.completed_at FROM schedule_ticks t "
            "JOIN workflow_runs r ON r.id = t.run_id WHERE t.schedule_id = $1 ORDER BY t.scheduled_at",
            schedule_id,
        )
    )


async def _first_tick(setup: BrokerSetup, schedule_id: str, *, more_than: int = 0) -> None:
    """Wait for the workers to be up (a loaded machine takes seconds to start one)."""
    for _ in range(600):
        if len(await _ticks(setup, schedule_id)) > more_than:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("no tick within 60 s")


async def _runs_in_workspace(setup: BrokerSetup) -> int:
    return int(
        await setup.rt.pool.fetchval(
            "SELECT count(*) FROM workflow_runs WHERE workspace_id = $1", setup.workspace_id
        )
    )


async def test_two_racing_workers_make_one_run_per_tick_and_a_paused_schedule_none(
    broker_setup: BrokerSetup,
) -> None:
    setup = broker_setup
    await create_definition(setup.rt, setup.workspace_id, {"name": "tick", "version": "1", "steps": QUICK})
    ticking = await _schedule(setup, "tick", intervalS=2, overlap="allow")
    paused = await _schedule(setup, "tick", intervalS=1, paused=True)
    workers = [_worker(setup), _worker(setup)]
    try:
        await _first_tick(setup, ticking)
        await asyncio.sleep(10)
        await schedule_store.update(setup.rt, setup.workspace_id, ticking, {"paused": True})
        await asyncio.sleep(1)
        found = await _ticks(setup, ticking)
        assert len(found) >= 4, [w.log_tail() for w in workers]
        gaps = {b["scheduled_at"] - a["scheduled_at"] for a, b in itertools.pairwise(found)}
        assert gaps == {timedelta(seconds=2)}  # every tick once: none missed, none doubled
        assert await _runs_in_workspace(setup) == len(found)
        assert await _ticks(setup, paused) == []
        for _ in range(100):
            if all(r["status"] == "COMPLETED" for r in await _ticks(setup, ticking)):
                break
            await asyncio.sleep(0.1)
        assert {r["status"] for r in await _ticks(setup, ticking)} == {"COMPLETED"}
    finally:
        for worker in workers:
            worker.stop()


async def test_skip_never_overlaps_a_slow_run(broker_setup: BrokerSetup) -> None:
    setup = broker_setup
    steps = [{"name": "slow", "type": "wait", "durationMs": 2500}]
    await create_definition(setup.rt, setup.workspace_id, {"name": "slow", "version": "1", "steps": steps})
    schedule_id = await _schedule(setup, "slow", intervalS=1, overlap="skip")
    workers = [_worker(setup), _worker(setup)]
    try:
        await _first_tick(setup, schedule_id)
        await asyncio.sleep(9)
        await schedule_store.update(setup.rt, setup.workspace_id, schedule_id, {"paused": True})
        found = await _ticks(setup, schedule_id)
        # The newest tick's run may not be claimed yet when the schedule pauses (a loaded machine's
        # broker hop): not started, it overlaps nothing. Every other run has started and ended.
        if found and found[-1]["started_at"] is None:
            found = found[:-1]
        assert len(found) >= 2, [w.log_tail() for w in workers]
        for earlier, later in itertools.pairwise(found):
            assert earlier["completed_at"] is not None
            assert later["started_at"] >= earlier["completed_at"]
        skipped = await setup.rt.pool.fetchval(
            "SELECT ticks_skipped FROM schedules WHERE id = $1", schedule_id
        )
        assert skipped >= len(found)
    finally:
        for worker in workers:
            worker.stop()


async def test_workers_stopped_for_three_ticks_catch_up_with_exactly_one_run(
    broker_setup: BrokerSetup,
) -> None:
    setup = broker_setup
    await create_definition(setup.rt, setup.workspace_id, {"name": "tick", "version": "1", "steps": QUICK})
    schedule_id = await _schedule(setup, "tick", intervalS=2, overlap="buffer_one", catchupWindowS=60)
    worker = _worker(setup)
    try:
        await _first_tick(setup, schedule_id)
        worker.stop()
        before = len(await _ticks(setup, schedule_id))
        skipped_before = await setup.rt.pool.fetchval(
            "SELECT ticks_skipped FROM schedules WHERE id = $1", schedule_id
        )
        await asyncio.sleep(7)  # three ticks or more with no worker
        worker = _worker(setup)
        await _first_tick(setup, schedule_id, more_than=before)
        found = await _ticks(setup, schedule_id)
        # The ticks missed while stopped made one run, not one each: the run after the stop is
        # for the latest of them (a worker takes seconds to start, so later than the stop + 7 s).
        gap = found[before]["scheduled_at"] - found[before - 1]["scheduled_at"]
        assert gap >= timedelta(seconds=8), worker.log_tail()
        skipped = await setup.rt.pool.fetchval(
            "SELECT ticks_skipped FROM schedules WHERE id = $1", schedule_id
        )
        assert skipped - skipped_before >= gap / timedelta(seconds=2) - 1  # the older missed ticks, counted
    finally:
        worker.stop()


async def test_a_debounce_burst_becomes_one_run_fired_by_a_worker(broker_setup: BrokerSetup) -> None:
    setup = broker_setup
    definition = {
        "name": "debounced",
        "version": "1",
        "steps": QUICK,
    }
    definition_id = await create_definition(setup.rt, setup.workspace_id, definition)
    await setup.rt.pool.execute(
        "INSERT INTO event_triggers (workspace_id, definition_name, trigger_index, definition_id, event_name, spec) "
        "VALUES ($1, 'debounced', 0, $2, 'doc.edited', $3)",
        setup.workspace_id,
        definition_id,
        {"event": "doc.edited", "debounce": {"key": "data.docId", "periodMs": 500}},
    )
    worker = _worker(setup)
    try:
        burst = [IncomingEvent("doc.edited", {"docId": "d1", "rev": n}) for n in range(10)]
        await receive(setup.rt, setup.workspace_id, burst)
        for _ in range(600):
            row = await setup.rt.pool.fetchrow(
                "SELECT input, status FROM workflow_runs WHERE workspace_id = $1", setup.workspace_id
            )
            if row is not None and row["status"] == "COMPLETED":
                break
            await asyncio.sleep(0.1)
        assert row is not None and row["status"] == "COMPLETED", worker.log_tail()
        assert row["input"] == {"docId": "d1", "rev": 9}
        assert await _runs_in_workspace(setup) == 1
    finally:
        worker.stop()
