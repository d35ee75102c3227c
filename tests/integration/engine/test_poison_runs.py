"""Poison runs end (issue 18): a run whose driver crashes again and again, or whose workers keep
dying while they hold it, FAILS with RUN_CRASH_LIMIT after STEVORA_MAX_RUN_CRASHES crashes in a
row. The count lives in the run's row (it survives the worker) and progress resets it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from stevora.db import transitions
from stevora.engine import commands, run_pool
from tests.conftest import Harness, create_definition

# A real crash: the database refuses the driver's transition (as a constraint, a trigger or a
# corrupt row would), which is not a step failure but an error in the driver itself.
_TRIGGER = """
CREATE OR REPLACE FUNCTION poison_{tag}() RETURNS trigger AS $$
BEGIN
    IF NEW.status = 'COMPLETED' AND NEW.step_name = 'poisoned_{tag}' THEN
        RAISE EXCEPTION 'refusing to complete step %', NEW.id;
    END IF;
    RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER poison_{tag} BEFORE UPDATE ON step_runs FOR EACH ROW EXECUTE FUNCTION poison_{tag}();
"""


async def _definition(harness: Harness, workspace_id: str, step_name: str) -> str:
    async def noop(ctx: Any) -> dict[str, Any]:
        return {"status": "completed"}

    harness.tasks.register("noop", noop)
    return await create_definition(
        harness.rt,
        workspace_id,
        {
            "name": f"wf-{step_name}",
            "version": "1",
            "steps": [
                {"type": "task", "name": "first", "handler": "noop"},
                {"type": "task", "name": step_name, "handler": "noop"},
            ],
        },
    )


async def test_a_run_whose_driver_crashes_every_time_fails_with_run_crash_limit(
    harness: Harness, workspace_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run_pool, "CRASH_BACKOFF_FIRST_MS", 10)
    # Each crash logs its traceback (slow to render in a terminal): three crashes make the point.
    monkeypatch.setattr(harness.rt.settings, "max_run_crashes", 3)
    tag = workspace_id.split("_")[1]
    await harness.rt.pool.execute(_TRIGGER.format(tag=tag))
    try:
        def_id = await _definition(harness, workspace_id, f"poisoned_{tag}")
        run, _ = await commands.create_run(harness.rt, workspace_id, def_id)
        row = await harness.wait_for_status(run["id"], "FAILED", timeout_s=30)
    finally:
        await harness.rt.pool.execute(f"DROP TRIGGER poison_{tag} ON step_runs; DROP FUNCTION poison_{tag}()")

    limit = harness.rt.settings.max_run_crashes
    assert row["error"]["code"] == "RUN_CRASH_LIMIT"
    assert row["error"]["details"] == {"crashes": limit, "limit": limit}
    assert row["error"]["stepName"] == f"poisoned_{tag}"
    assert row["lease_owner"] is None
    steps = await harness.rt.pool.fetch(
        "SELECT step_name, status, error FROM step_runs WHERE workflow_run_id = $1 ORDER BY created_at, step_index",
        run["id"],
    )
    assert [(s["step_name"], s["status"]) for s in steps] == [
        ("first", "COMPLETED"),
        (f"poisoned_{tag}", "FAILED"),
    ]
    assert steps[1]["error"]["code"] == "RUN_CRASH_LIMIT"
    assert (await harness.event_types(run["id"]))[-2:] == ["STEP_FAILED", "WORKFLOW_FAILED"]
    # Crashed `limit` times, each redispatched once; then no more tries.
    crashes = [d for rid, d in harness.dispatcher.sent if rid == run["id"] and d > 0]
    assert len(crashes) == limit - 1
    await asyncio.sleep(0.3)
    assert (
        await harness.rt.pool.fetchval("SELECT status FROM workflow_runs WHERE id = $1", run["id"])
    ) == "FAILED"

    # Once the cause is gone, a retry starts the count over and the run finishes.
    await commands.retry_run(harness.rt, workspace_id, run["id"])
    done = await harness.wait_for_status(run["id"], "COMPLETED")
    assert done["crash_count"] == 0


async def test_lease_takeovers_count_as_crashes_durably_across_workers(
    harness: Harness, workspace_id: str
) -> None:
    """Workers that die holding the run (their leases expire) each count once, in the row; the
    worker that takes over at the limit fails the run instead of driving it again."""
    def_id = await _definition(harness, workspace_id, "fine")
    pool = harness.rt.pool
    harness.dispatcher.run_pool = None  # no live worker until the dead ones have had their turn
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id)
    limit = harness.rt.settings.max_run_crashes
    for n in range(limit):
        claimed = await transitions.claim(pool, run["id"], f"dead-worker-{n}", 0.01)
        assert claimed is not None
        assert claimed[0]["crash_count"] == n, "the claim counts the takeover of the previous dead holder"
        await asyncio.sleep(0.03)  # the worker dies; its lease expires
    harness.dispatcher.run_pool = harness.run_pool
    await harness.dispatcher.dispatch(run["id"])
    row = await harness.wait_for_status(run["id"], "FAILED")
    assert row["error"]["code"] == "RUN_CRASH_LIMIT" and row["error"]["details"]["crashes"] == limit
    assert (
        await harness.rt.pool.fetchval(
            "SELECT count(*) FROM step_runs WHERE workflow_run_id = $1 AND status = 'COMPLETED'", run["id"]
        )
        == 0
    ), "the run was not driven again"


async def test_progress_resets_the_crash_count(
    harness: Harness, workspace_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Crashes with a step ending in between do not add up: a run crashing before each of its
    steps more often in total than the limit still completes."""
    monkeypatch.setattr(run_pool, "CRASH_BACKOFF_FIRST_MS", 10)
    limit = harness.rt.settings.max_run_crashes
    pool = harness.run_pool
    real_drive = pool.driver.drive
    counts: list[int] = []
    crashes_at: dict[str | None, int] = {}

    async def drive(run_id: str, at: Any) -> None:
        row = await harness.rt.pool.fetchrow(
            "SELECT crash_count, current_step_name FROM workflow_runs WHERE id = $1", run_id
        )
        counts.append(row["crash_count"])
        step = row["current_step_name"]
        if crashes_at.get(step, 0) < limit - 1:
            crashes_at[step] = crashes_at.get(step, 0) + 1
            raise RuntimeError("a bug in the driver")
        await real_drive(run_id, at)

    monkeypatch.setattr(pool.driver, "drive", drive)
    steps = [{"type": "wait", "name": f"w{i}", "durationMs": 1} for i in range(3)]
    def_id = await create_definition(
        harness.rt, workspace_id, {"name": "bumpy", "version": "1", "steps": steps}
    )
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id)
    done = await harness.wait_for_status(run["id"], "COMPLETED", timeout_s=30)
    assert sum(crashes_at.values()) > limit
    assert max(counts) == limit - 1 and done["crash_count"] == 0
