"""The recovery sweep: finds runs that need a worker and nobody is handling, and dispatches them.

Covers a worker that died (lease expired), a message that was lost or never sent (the gap
between commit and enqueue), runs that are due (wait over, retry backoff over, timeout), and
parents whose child run (a workflow called as a tool) ended without their result being written,
and `map` items' endings no worker recorded on their parent.
Every worker process runs it; `FOR UPDATE SKIP LOCKED` plus `dispatched_at` keep them from
dispatching the same run twice in one round (and a duplicate dispatch would be harmless anyway).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import TYPE_CHECKING

import structlog

from stevora.db import concurrency, runs
from stevora.db.retention import prune_finished_runs
from stevora.engine import map_recorder
from stevora.engine.hints import dispatch_hint
from stevora.engine.steps.awaited import workflow as workflow_calls
from stevora.observability.metrics import SWEEP_PICKUPS

if TYPE_CHECKING:
    from stevora.runtime import Runtime

log = structlog.get_logger("stevora.sweep")


async def sweep_once(rt: Runtime, *, limit: int = 500) -> list[str]:
    """Dispatch every run that is due and unowned. Returns the ids dispatched."""
    # `map` item endings whose worker died before recording them on the parent: recorded (and
    # what that starts dispatched) first, before the undispatched runs below: a child run such an
    # ending started (PENDING, never dispatched) for a parent that has ended since (cancelled) is
    # taken back by the recording, and must not be found undispatched and claimed before.
    ids = await map_recorder.record_stranded(rt, limit=limit)
    dispatched = await runs.mark_due_dispatched(rt.pool, rt.settings.undispatched_grace_s, limit)
    # A child run that ended while its parent could not be told: tell it now.
    dispatched += await workflow_calls.answer_finished_children(rt.pool)
    # Queued runs (concurrency slots) the sweep above leaves alone: those a slot is free for now.
    dispatched += await concurrency.dispatch_startable(rt.pool, rt.settings.undispatched_grace_s, limit)
    for run_id in dispatched:
        await dispatch_hint(rt.dispatcher, run_id)
    ids += dispatched
    if ids:
        SWEEP_PICKUPS.inc(len(ids))
        log.info("sweep_dispatched", runs=len(ids))
    return ids


# With STEVORA_RETENTION_DAYS set, each worker prunes finished runs this often (in small batches
# that skip locked rows, so several workers never contend and live runs are never touched).
PRUNE_INTERVAL_S = 600.0


async def sweep_forever(rt: Runtime) -> None:
    from stevora.webhooks.delivery import deliver_due

    next_prune = 0.0
    while True:
        try:
            await sweep_once(rt)
            await deliver_due(rt)
            days = rt.settings.retention_days
            if days and asyncio.get_running_loop().time() >= next_prune:
                next_prune = asyncio.get_running_loop().time() + PRUNE_INTERVAL_S
                pruned = await prune_finished_runs(rt.pool, timedelta(days=days))
                if pruned:
                    log.info("retention_pruned", runs=pruned, older_than_days=days)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("sweep_failed")
        await asyncio.sleep(rt.settings.sweep_interval_s)
