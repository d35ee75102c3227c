"""A `map` step with real worker processes, a real broker and SIGKILLs: killed right after its first
child runs were created (before any was dispatched), right after a child's ending committed (its
item's result and the next items' child runs, none dispatched), and while the parent collects the
results. Every item runs in exactly one child run (the side-effect log names it), the parent
completes once, and the output is in item order."""

from __future__ import annotations

import asyncio

import pytest

from stevora.engine import commands
from stevora.ids import new_id
from tests.conftest import create_definition
from tests.e2e.conftest import BrokerSetup
from tests.e2e.test_crash_recovery import assert_gap_free
from tests.e2e.workerproc import WorkerProcess

ITEMS = 12


@pytest.mark.broker
@pytest.mark.parametrize("fault", ["wait_committed:map", "parent_told", "map_collecting"])
async def test_a_map_survives_killed_workers_and_runs_every_item_once(
    broker_setup: BrokerSetup, fault: str
) -> None:
    setup = broker_setup
    tag = new_id("m")
    await create_definition(
        setup.rt,
        setup.workspace_id,
        {
            "name": "square",
            "version": "1",
            "steps": [{"type": "task", "name": "sq", "handler": "map_item_effect"}],
        },
    )
    parent_def = await create_definition(
        setup.rt,
        setup.workspace_id,
        {
            "name": "squares",
            "version": "1",
            "steps": [
                {
                    "type": "map",
                    "name": "fan",
                    "items": "{{input.numbers}}",
                    "workflow": "square",
                    "input": {"n": "{{item}}", "tag": "{{input.tag}}"},
                    "concurrency": 3,
                    "outputKey": "squares",
                }
            ],
        },
    )
    db, url, queue = setup.rt.settings.database_url, setup.url, setup.queue
    first = WorkerProcess(db, url, queue, fault=fault)
    second = None
    try:
        run, _ = await commands.create_run(
            setup.rt, setup.workspace_id, parent_def, {"numbers": list(range(ITEMS)), "tag": tag}
        )
        assert await first.wait_exit(60) == -9, first.log_tail()  # died at the fault point
        second = WorkerProcess(db, url, queue)
        deadline = asyncio.get_running_loop().time() + 90
        while True:
            row = await setup.rt.pool.fetchrow(
                "SELECT status, output, error FROM workflow_runs WHERE id = $1", run["id"]
            )
            if row["status"] in ("COMPLETED", "FAILED", "CANCELLED"):
                break
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"run is {row['status']}; worker log:\n{second.log_tail()}")
            await asyncio.sleep(0.2)
    finally:
        first.stop()
        if second is not None:
            second.stop()
    assert row["status"] == "COMPLETED", row["error"]
    assert row["output"]["squares"] == [{"n": n, "square": n * n} for n in range(ITEMS)]
    pool = setup.rt.pool
    children = await pool.fetch(
        "SELECT id, input, status FROM workflow_runs WHERE parent_run_id = $1", run["id"]
    )
    assert sorted(c["input"]["n"] for c in children) == list(range(ITEMS))  # one child run per item
    assert {c["status"] for c in children} == {"COMPLETED"}
    effects = await pool.fetch(
        "SELECT idempotency_key FROM test_side_effects WHERE idempotency_key LIKE $1", f"map:{tag}:%"
    )
    ran = sorted((int(k.split(":")[2]), k.split(":")[3]) for k in (e["idempotency_key"] for e in effects))
    by_child = {c["id"]: c["input"]["n"] for c in children}
    assert [n for n, _ in ran] == list(range(ITEMS))  # each item ran, in one child run only
    assert all(by_child[child] == n for n, child in ran)
    types = await assert_gap_free(setup, run["id"])
    assert types.count("WORKFLOW_COMPLETED") == 1 and types.count("STEP_COMPLETED") == 1
    assert types.count("MAP_ITEM_STARTED") == ITEMS and types.count("MAP_ITEM_COMPLETED") == ITEMS
