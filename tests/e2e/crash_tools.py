"""Tools and task handlers loaded by worker subprocesses in the crash tests.

Each records its side effect under the idempotency key Stevora hands it (the way a real handler
would use it with a payment or e-mail provider) and counts how often it actually ran.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import asyncpg

from stevora import StepContext, Toolbox, ToolContext, register_task_handler, tool, toolbox
from stevora.db.database import asyncpg_dsn

_pool: asyncpg.Pool | None = None


async def _db() -> asyncpg.Pool:
    global _pool
    if _pool is None:
        _pool = await asyncpg.create_pool(
            asyncpg_dsn(os.environ["STEVORA_DATABASE_URL"]), min_size=1, max_size=2
        )
    return _pool


async def record_effect(key: str) -> int:
    """Idempotent side effect: one row per key; `executions` counts how often the handler ran."""
    pool = await _db()
    return await pool.fetchval(
        "INSERT INTO test_side_effects (idempotency_key, executions) VALUES ($1, 1) "
        "ON CONFLICT (idempotency_key) DO UPDATE SET executions = test_side_effects.executions + 1 "
        "RETURNING executions",
        key,
    )


@tool
async def effect(note: str, ctx: ToolContext) -> dict[str, Any]:
    """Record a side effect for this tool call."""
    executions = await record_effect(ctx.idempotency_key)
    return {"ok": True, "round": ctx.round, "executions": executions}


async def slow_effect(ctx: StepContext) -> dict[str, Any]:
    await asyncio.sleep(float(ctx.config.get("sleepS", 2.0)))
    await record_effect(f"task:{ctx.idempotency_key}")
    return {"status": "completed", "stateUpdates": {ctx.step_name: "done"}}


register_task_handler("slow_effect", slow_effect)


_together: dict[str, tuple[list[int], asyncio.Event]] = {}


async def ends_together(ctx: StepContext) -> dict[str, Any]:
    """Return once the `n` runs of the input's `group` are all in this handler (one worker
    process), so that their endings fall in the same turn of the worker's loop however long the
    worker took to start (test_crash_group_commit, endings batched). Run again after the worker
    was killed (its effect already recorded), it returns at once: its siblings are not coming."""
    if await record_effect(f"task:{ctx.idempotency_key}") > 1:
        return {"status": "completed"}
    given = ctx.workflow_input
    arrived, all_in = _together.setdefault(given["group"], ([0], asyncio.Event()))
    arrived[0] += 1
    if arrived[0] >= int(given["n"]):
        all_in.set()
    await all_in.wait()
    return {"status": "completed"}


register_task_handler("ends_together", ends_together)


async def map_item_effect(ctx: StepContext) -> dict[str, Any]:
    """A `map` step's item (test_map_processes): its side effect names the item and the child run
    that ran it, so a second child run for one item shows as a second row."""
    tag, n = ctx.workflow_input["tag"], ctx.workflow_input["n"]
    await asyncio.sleep(float(ctx.config.get("sleepS", 0.05)))
    await record_effect(f"map:{tag}:{n}:{ctx.workflow_run_id}")
    return {"status": "completed", "stateUpdates": {"n": n, "square": n * n}}


register_task_handler("map_item_effect", map_item_effect)


@tool
async def remember(note: str, ctx: ToolContext) -> dict[str, Any]:
    """Record a side effect and append this call's key to the run's state."""
    executions = await record_effect(ctx.idempotency_key)
    ctx.update_state({"remembered": [*ctx.state.get("remembered", []), ctx.idempotency_key]})
    return {"ok": True, "executions": executions}


@toolbox
class Tally(Toolbox):
    """A toolbox whose state must survive a worker's death (test_crash_recovery)."""

    def __init__(self) -> None:
        self.count = 0

    def add(self, note: str) -> int:
        """Count one more; returns the count so far."""
        self.count += 1
        return self.count


@tool
async def route(note: str, ctx: ToolContext) -> dict[str, Any]:
    """Record a side effect, then send the run to the `finish` step (test_crash_recovery)."""
    executions = await record_effect(ctx.idempotency_key)
    ctx.goto("finish")
    return {"ok": True, "executions": executions}


@tool
async def finding(topic: str, size: int = 0) -> dict[str, Any]:
    """Look a topic up (test_long_horizon_processes): no side effect; `size` words of detail, and
    keys in an order `jsonb` would not keep, so a rebuilt transcript must repeat the bytes sent."""
    return {"zeta": f"about {topic}", "a": {"yy": 2, "b": 1}, "big": 1e16, "text": "detail " * size}


@tool
async def nap() -> dict[str, Any]:
    """Take three seconds (a turn that is still working when the next message arrives: test_threads_processes)."""
    await asyncio.sleep(3.0)
    return {"slept": 3}


@tool
async def count_visit(ctx: ToolContext) -> dict[str, Any]:
    """Add one to a counter in the memory store (its write lands with the call's checkpoint)."""
    await record_effect(ctx.idempotency_key)
    seen = await ctx.store.get(["visits"], ctx.workflow_run_id) or {"n": 0}
    await ctx.store.put(["visits"], ctx.workflow_run_id, {"n": seen["n"] + 1})
    return {"n": seen["n"] + 1}


@tool
async def save_preference(drink: str, ctx: ToolContext) -> dict[str, Any]:
    """Remember the user's drink in the memory store."""
    await ctx.store.put(["users", "u_42"], "prefs", {"drink": "green tea"})
    return {"saved": True}


@tool
async def read_preference(ctx: ToolContext) -> dict[str, Any]:
    """What the memory store knows about the user (found by full-text search)."""
    found = await ctx.store.search(["users"], "tea")
    return {"found": [item.value for item in found]}
