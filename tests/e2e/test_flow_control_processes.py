"""Concurrency keys with real worker processes, a real broker and SIGKILLs: never two runs of one key
at once (counted from the events), every run completes, none is forgotten in its queue."""

from __future__ import annotations

import asyncio
import os
import time
from collections import defaultdict
from itertools import pairwise

import pytest

from stevora.engine import commands
from tests.conftest import create_definition
from tests.e2e.conftest import BrokerSetup
from tests.e2e.workerproc import WorkerProcess

# The size (500 runs of 50 keys, four kills) with STEVORA_FLOW_FULL=1; CI runs a tenth of it.
FULL = os.environ.get("STEVORA_FLOW_FULL") == "1"
RUNS, KEYS, KILLS = (500, 50, 4) if FULL else (60, 10, 2)


@pytest.mark.broker
async def test_a_key_limit_of_one_holds_through_worker_kills_and_every_run_completes(
    broker_setup: BrokerSetup,
) -> None:
    setup = broker_setup
    def_id = await create_definition(
        setup.rt,
        setup.workspace_id,
        {
            "name": "keyed",
            "version": "1",
            "concurrency": {"key": "{{input.k}}", "limit": 1},
            "steps": [
                {"type": "task", "name": "a", "handler": "slow_effect", "config": {"sleepS": 0.15}},
                {"type": "task", "name": "b", "handler": "slow_effect", "config": {"sleepS": 0.15}},
            ],
        },
    )
    db, url, queue = setup.rt.settings.database_url, setup.url, setup.queue
    workers = [WorkerProcess(db, url, queue), WorkerProcess(db, url, queue)]
    everyone = list(workers)  # the killed ones too: each is stopped (its log closed) at the end
    try:
        ids = [
            (await commands.create_run(setup.rt, setup.workspace_id, def_id, {"k": f"k{i % KEYS}"}))[0]["id"]
            for i in range(RUNS)
        ]
        started = time.monotonic()
        for _ in range(KILLS):  # kill a worker mid-flight, each time starting a fresh one
            await asyncio.sleep(1.5)
            workers[0].kill()
            workers = [*workers[1:], WorkerProcess(db, url, queue)]
            everyone.append(workers[-1])
        deadline = asyncio.get_running_loop().time() + 120
        while True:
            left = await setup.rt.pool.fetchval(
                "SELECT count(*) FROM workflow_runs WHERE id = ANY($1::text[]) AND status <> 'COMPLETED'", ids
            )
            if left == 0:
                break
            if asyncio.get_running_loop().time() > deadline:
                logs = "\n".join(w.log_tail() for w in workers)
                raise AssertionError(f"{left} runs not completed; worker logs:\n{logs}")
            await asyncio.sleep(0.2)
        print(f"{RUNS} runs of {KEYS} keys, {KILLS} kills, {setup.name}: {time.monotonic() - started:.1f} s")
    finally:
        for w in everyone:
            w.stop()
    rows = await setup.rt.pool.fetch(
        "SELECT r.concurrency_key AS key, "
        "  min(e.created_at) FILTER (WHERE e.event_type = 'WORKFLOW_STARTED') AS started, "
        "  max(e.created_at) FILTER (WHERE e.event_type = 'WORKFLOW_COMPLETED') AS ended, "
        "  count(*) FILTER (WHERE e.event_type = 'WORKFLOW_STARTED') AS starts "
        "FROM workflow_runs r JOIN workflow_events e ON e.workflow_run_id = r.id "
        "WHERE r.id = ANY($1::text[]) GROUP BY r.id ORDER BY key, started",
        ids,
    )
    assert len(rows) == RUNS and all(r["starts"] == 1 for r in rows)
    by_key: dict[str, list] = defaultdict(list)
    for r in rows:
        by_key[r["key"]].append(r)
    assert len(by_key) == KEYS
    for key, runs in by_key.items():
        for before, after in pairwise(runs):
            assert after["started"] >= before["ended"], f"two runs of {key} at once"
