"""Executes claimed runs as asyncio tasks inside one worker process.

A Dramatiq message only asks "look at run X": the actor calls `submit`, which claims the run's
lease in PostgreSQL and starts a task, then returns at once. The claims of concurrent submits
(several threads' messages, a map step's children) share one statement and one commit
(`stevora.engine.claim_batch`). So a worker thread is never held
for the seconds an LLM call takes, and one process can hold thousands of runs in flight (the
limit is `max_concurrent_runs`, not the thread count). The price is that the message is acked
before the run is done; the lease covers that: if this process dies, the lease expires and the
recovery sweep dispatches the run again.

One heartbeat statement per interval renews the leases of every run this process holds; a run
missing from its result was cancelled, paused or taken over, and its task is cancelled.

Database outages: the claim, the heartbeat and the release retry lost connections with backoff
(`stevora.db.transient`), so a PostgreSQL restart of a few seconds costs a few seconds, not a
whole lease. A driver that still fails after its retry budget (or hits a bug) hands the lease
back and redispatches the run with a delay that doubles with each consecutive crash of that run
(0.5 s up to 30 s), so a run that crashes the driver every time cannot spin a worker. Each crash
is also counted in the run's row, and after `STEVORA_MAX_RUN_CRASHES` in a row the run FAILS
with RUN_CRASH_LIMIT (stevora/engine/poison.py).
"""

from __future__ import annotations

import asyncio
import os
import socket
from functools import partial
from typing import TYPE_CHECKING, Any

import structlog

from stevora.db import runs
from stevora.db.transient import Retrier, retry_transient
from stevora.engine import flow, poison
from stevora.engine.claim_batch import ClaimBatcher, Fallback
from stevora.engine.driver import Position, RunDriver
from stevora.engine.hints import dispatch_hint
from stevora.ids import random_token
from stevora.observability import hooks as observe

if TYPE_CHECKING:
    from stevora.db.reads.rows import DbRow
    from stevora.runtime import Runtime

log = structlog.get_logger("stevora.worker")

CRASH_BACKOFF_FIRST_MS = 500
CRASH_BACKOFF_MAX_MS = 30_000
_CRASH_MEMORY = 10_000  # runs whose crash count is remembered; beyond that the counts start over


def crash_backoff_ms(crashes: int) -> int:
    """Delay before redispatching a run whose driver crashed `crashes` times in a row."""
    return int(min(CRASH_BACKOFF_FIRST_MS * 2 ** min(crashes - 1, 16), CRASH_BACKOFF_MAX_MS))


def _position(run_id: str, row: DbRow, started: dict[str, Any] | None) -> tuple[str, Position]:
    """Where the driver goes on from a claim's rows (`started`: the first step run, when the
    claim started the run)."""
    if started is not None:
        log.info("run_started", workflow_run_id=run_id)
    return run_id, Position(row, started, fresh=started is not None)


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{random_token(6)}"


class RunPool:
    def __init__(self, rt: Runtime, *, worker_id: str | None = None) -> None:
        self.rt = rt
        self.worker_id = worker_id or new_worker_id()
        self.driver = RunDriver(rt, self.worker_id)
        self.claims = ClaimBatcher(rt.pool, self.worker_id, rt.settings.lease_s)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._slots = asyncio.Semaphore(rt.settings.max_concurrent_runs)
        self._heartbeat: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self._crashes: dict[str, int] = {}  # run id -> consecutive driver crashes in this process
        # Runs dispatched while this process was still driving them (e.g. a child run that ended
        # and woke its parent before the parent's pass had returned): submitted again once that
        # pass ends, instead of being left to the sweep.
        self._again: set[str] = set()
        self._resubmits: set[asyncio.Task[bool]] = set()
        self._closing = False

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
            self._again.add(run_id)
            return False
        if self._closing:
            return False  # not claimed here: the sweep (or the worker that resumes it) dispatches it
        await self._slots.acquire()
        if self._closing:  # woken by a slot a cancelled run gave back
            self._slots.release()
            return False
        try:
            got = await self._claim(run_id)
        except BaseException:
            self._slots.release()
            raise
        if got is None or got[0] in self._tasks:
            self._slots.release()
            return False
        run_id, at = got  # another run when one of a higher priority was claimed instead
        if self._closing:
            # Claimed while this worker closes (e.g. through flow control, past `close`'s wait for
            # the batched claims): hand the lease back now, whether `close` has released its
            # leases yet or not, so the run does not wait for its lease to expire.
            self._slots.release()
            await retry_transient(lambda: self.driver.release(run_id), "release", workflow_run_id=run_id)
            await dispatch_hint(self.rt.dispatcher, run_id)
            return False
        task = asyncio.create_task(self._run(run_id, at), name=f"run-{run_id}")
        self._tasks[run_id] = task
        self._idle.clear()
        return True

    async def _claim(self, run_id: str) -> tuple[str, Position] | None:
        """The claim, which also starts a PENDING run (`transitions.claim`; the claims of
        concurrent submits share one statement, `stevora.engine.claim_batch`); a run it refuses
        goes on through the flow control of `stevora.engine.flow`. The driver goes on from the
        rows it returns."""
        got = await self.claims.claim(run_id)
        if isinstance(got, Fallback):
            return await self._claim_alone(run_id, fast=got.fast, maybe_ours=got.maybe_ours)
        return _position(run_id, *got)

    async def _claim_alone(self, run_id: str, *, fast: bool, maybe_ours: bool) -> tuple[str, Position] | None:
        """`flow.claim` of one run; `fast=False` when the fast statement already refused it,
        `maybe_ours` when a try of it had an unknown outcome (see `Fallback`)."""
        retrier = Retrier("claim", workflow_run_id=run_id)
        while True:
            try:
                got, others = await flow.claim(
                    self.rt.pool, run_id, self.worker_id, self.rt.settings.lease_s, fast=fast
                )
                for other in others:
                    await dispatch_hint(self.rt.dispatcher, other)
                if got is None and (maybe_ours or retrier.outcome_unknown):
                    # The failed try may have committed the claim: then the lease is ours already.
                    current = await runs.get_claimed(self.rt.pool, run_id)
                    if current is not None and current["lease_owner"] == self.worker_id:
                        return run_id, Position(current)
                if got is None:
                    return None
                run_id, (row, started) = got
                return _position(run_id, row, started)
            except Exception as exc:
                await retrier.pause(exc)

    async def _run(self, run_id: str, at: Position) -> None:
        try:
            if at.run["crash_count"] >= self.rt.settings.max_run_crashes:
                # Taken over from workers that died with it again and again: end it, do not drive it.
                await poison.fail_crashed(self.rt, run_id, self.worker_id, at.run["crash_count"])
                return
            name = (await self.rt.definitions.get(at.run["definition_id"])).name
            with observe.run_execution(at.run, name, self.worker_id):
                await self.driver.drive(run_id, at)
            self._crashes.pop(run_id, None)
        except asyncio.CancelledError:
            raise
        except Exception:
            # The database stayed away past the retry budget, or a bug: hand the lease back and
            # redispatch so the run does not wait out its lease — later each time it crashes again.
            if len(self._crashes) >= _CRASH_MEMORY:
                self._crashes.clear()
            crashes = self._crashes[run_id] = self._crashes.get(run_id, 0) + 1
            delay_ms = crash_backoff_ms(crashes)
            log.exception(
                "run_driver_crashed", workflow_run_id=run_id, crashes=crashes, redispatch_in_ms=delay_ms
            )
            try:
                await self._crashed(run_id, delay_ms)
            except Exception:
                log.warning("lease_release_failed", workflow_run_id=run_id, exc_info=True)
        finally:
            self._tasks.pop(run_id, None)
            self._slots.release()
            if run_id in self._again and not self._closing:
                self._again.discard(run_id)
                again = asyncio.get_running_loop().create_task(self.submit(run_id))
                self._resubmits.add(again)
                again.add_done_callback(self._resubmits.discard)
            if not self._tasks:
                self._idle.set()

    async def _crashed(self, run_id: str, delay_ms: int) -> None:
        """Count the crash durably; at the limit FAIL the run, else hand it back for a later try."""
        count = await retry_transient(
            lambda: poison.record_crash(self.rt, run_id, self.worker_id),
            "record_crash",
            workflow_run_id=run_id,
        )
        if count is not None and count >= self.rt.settings.max_run_crashes:
            if await poison.fail_crashed(self.rt, run_id, self.worker_id, count):
                self._crashes.pop(run_id, None)
                return
        await retry_transient(lambda: self.driver.release(run_id), "release", workflow_run_id=run_id)
        await dispatch_hint(self.rt.dispatcher, run_id, delay_ms=delay_ms)

    async def _heartbeat_loop(self) -> None:
        settings = self.rt.settings
        while True:
            await asyncio.sleep(settings.heartbeat_s)
            held = list(self._tasks)
            if not held:
                continue
            try:
                # Retried within one interval: the next beat starts from scratch anyway.
                still_ours = await retry_transient(
                    partial(runs.renew_leases, self.rt.pool, held, self.worker_id, settings.lease_s),
                    "heartbeat",
                    budget_s=settings.heartbeat_s,
                )
            except Exception:
                log.warning("heartbeat_failed", runs=len(held), exc_info=True)
                continue
            for run_id in held:
                task = self._tasks.get(run_id)
                if run_id not in still_ours and task is not None:
                    log.info("run_lease_revoked", workflow_run_id=run_id)
                    task.cancel()

    async def wait_idle(self, timeout_s: float | None = None) -> None:
        await asyncio.wait_for(self._idle.wait(), timeout_s)

    async def close(self) -> None:
        """Stop every run and hand its lease back so another worker resumes it at once."""
        self._closing = True
        # Claims still in flight commit (or not) first: one that committed after the leases were
        # handed back would leave its run leased to a closed worker until the lease expired.
        await self.claims.drain()
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            await asyncio.gather(self._heartbeat, return_exceptions=True)
            self._heartbeat = None
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for run_id in await runs.release_all(self.rt.pool, self.worker_id):
            await dispatch_hint(self.rt.dispatcher, run_id)
