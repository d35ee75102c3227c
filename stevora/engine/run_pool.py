"""Executes claimed runs as asyncio tasks inside one worker process.

A Dramatiq message only asks "look at run X": the actor calls `submit`, which claims the run's
lease in PostgreSQL and starts a task, then returns at once. So a worker thread is never held
for the seconds an LLM call takes, and one process can hold thousands of runs in flight (the
limit is `max_concurrent_runs`, not the thread count). The price is that the message is acked
before the run is done; the lease covers that: if this process dies, the lease expires and the
recovery sweep dispatches the run again.

One heartbeat statement per interval renews the leases of every run this process holds; a run
missing from its result was cancelled, paused or taken over, and its task is cancelled.
"""

from __future__ import annotations

import asyncio
import os
import socket
from typing import TYPE_CHECKING

import asyncpg
import structlog

from stevora.engine import store
from stevora.engine.runner import RunDriver
from stevora.ids import random_token

if TYPE_CHECKING:
    from stevora.runtime import Runtime

log = structlog.get_logger("stevora.worker")

CLAIM_SQL = f"""
UPDATE workflow_runs SET lease_owner = $2, lease_expires_at = now() + make_interval(secs => $3),
       version = version + 1
WHERE id = $1
  AND status IN ('PENDING', 'RUNNING', 'WAITING')
  AND (lease_owner IS NULL OR lease_expires_at < now())
  AND (next_run_at IS NULL OR next_run_at <= now())
  AND (status <> 'WAITING' OR next_run_at IS NOT NULL)
RETURNING {store.RUN_COLUMNS}
"""


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{random_token(6)}"


async def claim(pool: asyncpg.Pool, run_id: str, owner: str, lease_s: float) -> asyncpg.Record | None:
    """Take the run's lease if it is free and the run has something to do now."""
    return await pool.fetchrow(CLAIM_SQL, run_id, owner, lease_s)


class RunPool:
    def __init__(self, rt: Runtime, *, worker_id: str | None = None) -> None:
        self.rt = rt
        self.worker_id = worker_id or new_worker_id()
        self.driver = RunDriver(rt, self.worker_id)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._slots = asyncio.Semaphore(rt.settings.max_concurrent_runs)
        self._heartbeat: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def active_run_ids(self) -> list[str]:
        return list(self._tasks)

    def start(self) -> None:
        if self._heartbeat is None:
            self._heartbeat = asyncio.create_task(self._heartbeat_loop(), name="stevora-heartbeat")

    async def submit(self, run_id: str) -> bool:
        """Claim and start `run_id`. False when it is not ours to run (duplicate message, leased
        elsewhere, not due, finished). Waits for a free slot when the process is full."""
        if run_id in self._tasks:
            return False
        await self._slots.acquire()
        try:
            row = await claim(self.rt.pool, run_id, self.worker_id, self.rt.settings.lease_s)
        except BaseException:
            self._slots.release()
            raise
        if row is None or run_id in self._tasks:
            self._slots.release()
            return False
        task = asyncio.create_task(self._run(run_id), name=f"run-{run_id}")
        self._tasks[run_id] = task
        self._idle.clear()
        return True

    async def _run(self, run_id: str) -> None:
        try:
            await self.driver.drive(run_id)
        except asyncio.CancelledError:
            raise
        except Exception:
            # Infrastructure trouble (database restart...). Free the lease so the sweep retries soon.
            log.exception("run_driver_crashed", workflow_run_id=run_id)
            try:
                await self.driver.release(run_id)
            except Exception:
                log.warning("lease_release_failed", workflow_run_id=run_id)
        finally:
            self._tasks.pop(run_id, None)
            self._slots.release()
            if not self._tasks:
                self._idle.set()

    async def _heartbeat_loop(self) -> None:
        settings = self.rt.settings
        while True:
            await asyncio.sleep(settings.heartbeat_s)
            held = list(self._tasks)
            if not held:
                continue
            try:
                rows = await self.rt.pool.fetch(
                    "UPDATE workflow_runs SET lease_expires_at = now() + make_interval(secs => $3) "
                    "WHERE id = ANY($1::text[]) AND lease_owner = $2 AND status IN ('PENDING', 'RUNNING', 'WAITING') "
                    "RETURNING id",
                    held,
                    self.worker_id,
                    settings.lease_s,
                )
            except Exception:
                log.warning("heartbeat_failed", runs=len(held))
                continue
            still_ours = {r["id"] for r in rows}
            for run_id in held:
                task = self._tasks.get(run_id)
                if run_id not in still_ours and task is not None:
                    log.info("run_lease_revoked", workflow_run_id=run_id)
                    task.cancel()

    async def wait_idle(self, timeout_s: float | None = None) -> None:
        await asyncio.wait_for(self._idle.wait(), timeout_s)

    async def close(self) -> None:
        """Stop every run and hand its lease back so another worker resumes it at once."""
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            await asyncio.gather(self._heartbeat, return_exceptions=True)
            self._heartbeat = None
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        held = await self.rt.pool.fetch(
            "UPDATE workflow_runs SET lease_owner = NULL, lease_expires_at = NULL, dispatched_at = NULL "
            "WHERE lease_owner = $1 RETURNING id",
            self.worker_id,
        )
        for row in held:
            await self.rt.dispatcher.dispatch(row["id"])
