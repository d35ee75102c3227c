"""A run whose driver crashes (a bug, or the database gone past the retry budget) is handed back and
redispatched later each time: it can never spin a worker in a crash loop, and it still finishes."""

from __future__ import annotations

from typing import Any

import pytest

from stevora.engine import commands, run_pool
from stevora.engine.run_pool import crash_backoff_ms
from tests.conftest import Harness, create_definition


def test_backoff_doubles_from_half_a_second_up_to_thirty() -> None:
    assert [crash_backoff_ms(n) for n in (1, 2, 3, 4, 6, 7, 50)] == [
        500,
        1000,
        2000,
        4000,
        16000,
        30000,
        30000,
    ]


async def test_crashing_driver_is_redispatched_with_growing_delays_then_finishes(
    harness: Harness, workspace_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run_pool, "CRASH_BACKOFF_FIRST_MS", 20)
    pool = harness.run_pool
    real_drive = pool.driver.drive
    crashes = 0

    async def drive(run_id: str, at: Any) -> None:
        nonlocal crashes
        if crashes < 3:
            crashes += 1
            raise RuntimeError("a bug in the driver")
        await real_drive(run_id, at)

    monkeypatch.setattr(pool.driver, "drive", drive)

    async def noop(ctx: Any) -> dict[str, Any]:
        return {"status": "completed"}

    harness.tasks.register("noop", noop)
    def_id = await create_definition(
        harness.rt,
        workspace_id,
        {"name": "crashy", "version": "1", "steps": [{"type": "task", "name": "t", "handler": "noop"}]},
    )
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id)
    await harness.wait_for_status(run["id"], "COMPLETED")

    redispatches = [delay for rid, delay in harness.dispatcher.sent if rid == run["id"] and delay > 0]
    assert redispatches == [20, 40, 80]
    # The count starts over once the run got through: a later crash waits the first delay again.
    assert run["id"] not in pool._crashes
