"""The workers' trigger pass: due schedule ticks, due debounce / batch groups, and events stored
but left unprocessed (their API process died between storing and processing).

Every worker runs it every STEVORA_TRIGGER_POLL_S (no extra daemon, no leader): the rows are
claimed with `FOR UPDATE SKIP LOCKED`, so workers share the work and a dead one holds nothing.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import structlog

from stevora.triggers import events, grouping, schedules

if TYPE_CHECKING:
    from stevora.runtime import Runtime

log = structlog.get_logger("stevora.triggers")


async def trigger_pass(rt: Runtime) -> int:
    """One pass; the number of runs it started."""
    started = len(await schedules.due_pass(rt)) + len(await grouping.fire_due(rt))
    await events.process_stale(rt)
    return started


async def triggers_forever(rt: Runtime) -> None:
    while True:
        try:
            await trigger_pass(rt)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("trigger_pass_failed")
        await asyncio.sleep(rt.settings.trigger_poll_s)
