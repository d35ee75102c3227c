"""The tool and task handlers the chaos suite's worker processes load (`STEVORA_TOOL_MODULES`).

Each real execution is recorded under the idempotency key Stevora hands the handler, so the
suite can check side effects happened once per key (twice at most for a call killed between
its return and its commit). Recording retries through the suite's own database outages.
"""

from __future__ import annotations

import asyncio
import os
import random
import uuid
from typing import Any

import asyncpg

from stevora import StepContext, ToolContext, register_task_handler, tool
from stevora.db.database import asyncpg_dsn
from stevora.db.transient import retry_transient
from stevora.errors import StepError

_pool: asyncpg.Pool | None = None


async def _db() -> asyncpg.Pool:
    global _pool
    if _pool is None:
        _pool = await retry_transient(
            lambda: asyncpg.create_pool(
                asyncpg_dsn(os.environ["STEVORA_DATABASE_URL"]), min_size=1, max_size=4
            ),
            "chaos_pool",
        )
    return _pool


async def record_execution(key: str, kind: str) -> None:
    pool = await _db()
    # The execution's own id: when the insert committed but its answer was lost in an outage, the
    # retry finds the row instead of counting this execution twice.
    execution_id = uuid.uuid4().hex
    await retry_transient(
        lambda: pool.execute(
            "INSERT INTO chaos_executions (execution_id, idempotency_key, kind, pid) VALUES ($1, $2, $3, $4) "
            "ON CONFLICT (execution_id) DO NOTHING",
            execution_id,
            key,
            kind,
            os.getpid(),
        ),
        "chaos_effect",
    )


@tool
async def chaos_effect(item: str, ctx: ToolContext) -> dict[str, Any]:
    """Record one side effect for this tool call."""
    await asyncio.sleep(random.uniform(0, 0.05))
    await record_execution(ctx.idempotency_key, "tool")
    return {"ok": True, "item": item}


async def chaos_prepare(ctx: StepContext) -> dict[str, Any]:
    await record_execution(f"task:{ctx.idempotency_key}", "task")
    return {"status": "completed", "stateUpdates": {"draft": f"draft for {ctx.workflow_run_id}"}}


async def chaos_flaky(ctx: StepContext) -> dict[str, Any]:
    """Fails its first two attempts (a retrying task), then succeeds."""
    await record_execution(f"task:{ctx.idempotency_key}", "task")
    if ctx.attempt < 3:
        raise StepError(f"flaky attempt {ctx.attempt}", code="FLAKY")
    return {"status": "completed", "stateUpdates": {"flaky": ctx.attempt}}


register_task_handler("chaos_prepare", chaos_prepare)
register_task_handler("chaos_flaky", chaos_flaky)
