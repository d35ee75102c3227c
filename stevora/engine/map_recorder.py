"""Recording `map` items' endings on their parent, in batches, after the commits that ended them.

A map item's child run ends its item in its own terminal statement (migration 0028) and takes no
lock of its parent. The worker that committed it then asks this process's recorder to record the
parent's endings (`poke`): at most one recording in flight per parent in this process, run again
when more endings arrived meanwhile, so siblings ending together are recorded in one statement
under one parent lock (`map_items.record_endings`: counts, `MAP_ITEM_*` events, the parent's wait
made due when the map is done). The children it started and, when due, the parent are dispatched
once it has committed.

A recording that never happens (the worker died between the ending's commit and the recording, or
the database refused it) is the sweep's (`record_stranded`: after half the undispatched grace
period, before the sweep dispatches runs nobody dispatched; one parent's failure logged, the
others recorded), and the parent's own re-check records too before it looks at its items
(`stevora.engine.steps.map`). Recording is idempotent: an ending is recorded once, by whichever
gets there first.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import structlog

from stevora.db import map_items as db_map
from stevora.db.transient import retry_transient
from stevora.engine.hints import dispatch_hints

if TYPE_CHECKING:
    from stevora.runtime import Runtime

log = structlog.get_logger("stevora.engine")


class MapRecorder:
    """This process's recordings in flight, one per parent run."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._running: dict[str, asyncio.Task[None]] = {}
        self._again: set[str] = set()

    def poke(self, parent_run_id: str) -> None:
        """Record the parent's unrecorded endings soon (now, or again after the recording in flight)."""
        if parent_run_id in self._running:
            self._again.add(parent_run_id)
            return
        task = asyncio.get_running_loop().create_task(
            self._record(parent_run_id), name=f"map-record-{parent_run_id}"
        )
        self._running[parent_run_id] = task

    async def _record(self, parent_run_id: str) -> None:
        try:
            while True:
                self._again.discard(parent_run_id)
                await record(self.rt, parent_run_id)
                if parent_run_id not in self._again:
                    return
        except asyncio.CancelledError:
            raise
        except Exception:  # the sweep records it (`record_stranded`)
            log.warning("map_record_failed", workflow_run_id=parent_run_id, exc_info=True)
        finally:
            self._running.pop(parent_run_id, None)
            self._again.discard(parent_run_id)

    async def close(self) -> None:
        """Let the recordings in flight finish (each is one statement)."""
        while self._running:
            await asyncio.gather(*self._running.values(), return_exceptions=True)


def poke(rt: Runtime, parent_run_id: str) -> None:
    """Have this process record the parent's map item endings (its recorder made at first use)."""
    recorder = rt.map_recorder
    if recorder is None:
        recorder = rt.map_recorder = MapRecorder(rt)
    recorder.poke(parent_run_id)


async def record(rt: Runtime, parent_run_id: str) -> list[str]:
    """Record the parent's unrecorded endings now (one statement), then dispatch what it started."""
    woken = await retry_transient(
        lambda: db_map.record_endings(rt.pool, parent_run_id), "map_record", workflow_run_id=parent_run_id
    )
    await dispatch_hints(rt.dispatcher, woken)
    return woken


def dispatch_after_commit(rt: Runtime, parent_run_id: str, run_ids: list[str]) -> None:
    """Dispatch child runs started in a transaction that holds the parent's row lock and has not
    committed yet (the parent's re-check, in its driver's transaction), once it has ended: a task
    of this process waits for the lock (`FOR SHARE`), on a connection of its own, so the caller
    never waits for a second connection while it holds one. Children a rollback took away are
    not dispatched."""
    if not run_ids:
        return
    task = asyncio.get_running_loop().create_task(
        _dispatch_when_unlocked(rt, parent_run_id, run_ids), name=f"map-dispatch-{parent_run_id}"
    )
    _AFTER_COMMIT.add(task)
    task.add_done_callback(_AFTER_COMMIT.discard)


_AFTER_COMMIT: set[asyncio.Task[None]] = set()


async def _dispatch_when_unlocked(rt: Runtime, parent_run_id: str, run_ids: list[str]) -> None:
    try:
        async with rt.pool.acquire() as conn, conn.transaction():
            there = await db_map.pending_once_unlocked(conn, parent_run_id, run_ids)
        await dispatch_hints(rt.dispatcher, there)
    except asyncio.CancelledError:
        raise
    except Exception:  # the sweep dispatches them after the grace period
        log.warning("map_dispatch_failed", workflow_run_id=parent_run_id, exc_info=True)


async def record_stranded(rt: Runtime, *, limit: int = 500) -> list[str]:
    """The sweep's part: record the endings no worker recorded within the grace period (it died
    after the ending's commit). Returns the runs dispatched. A parent whose recording fails (even
    after the transient retries) is logged and left for the next round; the others are recorded."""
    woken: list[str] = []
    # Half the grace period after which the sweep dispatches a PENDING run nobody dispatched: an
    # ending is recorded (a start the map no longer wants taken back) well before the child run it
    # started could be found undispatched, by this worker's sweep or another's.
    for parent_run_id in await db_map.parents_with_unrecorded(
        rt.pool, rt.settings.undispatched_grace_s / 2, limit
    ):
        try:
            woken += await record(rt, parent_run_id)
        except asyncio.CancelledError:
            raise
        except Exception:  # stops no other parent, nor the rest of the sweep: the next round retries
            log.warning("map_record_failed", workflow_run_id=parent_run_id, exc_info=True)
    if woken:
        log.info("map_endings_recorded_by_sweep", runs=len(woken))
    return woken
