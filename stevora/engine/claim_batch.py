"""Claim batching: the claims of concurrent messages in one statement (one round trip, one commit).

Each message "look at run X" used to be its own claim statement and commit (`transitions.claim`,
which also starts a PENDING run). When thousands of runs are dispatched at once, a worker's
threads each block until their claim is back, so the runs start one claim at a time per thread.
The `RunPool` owns one `ClaimBatcher`; it follows group commit's rules (stevora/db/group_commit.py):

* no timer: a caller that finds nothing in flight waits one turn of the event loop (callers of
  that same turn join it) and, still alone, sends today's single-run statement itself, so a lone
  claim pays what it always paid (one loop turn more); claims that arrive while a statement is
  in flight wait for the next one, which a flusher task sends as soon as that one is back;
* a batch is **one** statement (`transitions.claim_batch`), the fast claim over arrays of run
  ids: every run keeps its own fence, and the statement is one implicit transaction, so each
  caller is woken only after its claim committed;
* a run the fast fence refuses (it needs a slot, is outranked, is leased elsewhere, is not due,
  has ended) is refused alone: its caller goes on through `stevora.engine.flow` without the fast
  statement, exactly as after a refused single claim; a run id never appears twice in one
  statement (the second caller waits for the next one, where the fence refuses it as before);
* a lost connection retries the statement (`Retrier`); a try whose outcome was unknown may have
  committed, so a refusal after it is checked by the caller (`runs.get_claimed`: leased by this
  worker means claimed); a batch that fails for any other reason sends each caller down the
  single-run path, so only the offending run gets the error;
* a caller cancelled while it waits cancels only its own future (the flusher, not a caller's
  task, sends shared statements). A claim that commits for a caller already gone leaves that run
  leased with nothing driving it, as a cancelled single claim did: the lease expires and the
  recovery sweep dispatches it again (DESIGN.md §1).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import asyncpg

from stevora.db import transitions
from stevora.db.transient import Retrier, is_transient
from stevora.engine.flow import Claimed


@dataclass(frozen=True, slots=True)
class Fallback:
    """The batch did not claim the run: go on with the single-run path (`stevora.engine.flow`).
    `fast`: that path's fast statement still has to be tried (the run's statement failed for a
    reason of its own). `maybe_ours`: an earlier try's outcome was unknown, so the run may be
    leased by this worker already (check `runs.get_claimed` before believing a refusal)."""

    fast: bool
    maybe_ours: bool


REFUSED = Fallback(fast=False, maybe_ours=False)
REFUSED_UNSURE = Fallback(fast=False, maybe_ours=True)


@dataclass(slots=True)
class _Pending:
    run_id: str
    done: asyncio.Future[Claimed | Fallback]


class ClaimBatcher:
    """`await claim(run_id)`: what the fast claim returned for the run (it is now leased by
    `owner`, and started if it was PENDING), or a `Fallback`; raises the database error when the
    retries gave up. See the module docstring."""

    def __init__(self, pool: asyncpg.Pool, owner: str, lease_s: float, *, max_batch: int = 200) -> None:
        self.pool = pool
        self.owner = owner
        self.lease_s = lease_s
        self.max_batch = max_batch
        self._queue: list[_Pending] = []
        self._in_flight = False  # a statement is on the wire (a lone caller's or the flusher's)
        self._flusher: asyncio.Task[None] | None = None
        self.batches = 0  # statements of several runs sent (for tests and benchmarks)
        self.rows = 0  # runs those statements carried

    async def claim(self, run_id: str) -> Claimed | Fallback:
        done: asyncio.Future[Claimed | Fallback] = asyncio.get_running_loop().create_future()
        item = _Pending(run_id, done)
        self._queue.append(item)
        if self._in_flight:
            return await done  # sent by the flusher, after the statement in flight
        self._in_flight = True
        try:
            await asyncio.sleep(0)  # callers of this same loop turn join
        except BaseException:
            self._queue.remove(item)  # cancelled before anything was sent
            self._in_flight = False
            self._flush_queued()
            raise
        if len(self._queue) == 1:  # alone: its statement from its own task
            self._queue = []
            try:
                await self._send([item])
            finally:
                self._in_flight = False
                self._flush_queued()
            return done.result()
        self._in_flight = False
        self._flush_queued()
        return await done

    async def drain(self) -> None:
        """Wait until every claim queued or on the wire is settled (the worker's shutdown)."""
        while self._queue or self._in_flight:
            if self._flusher is not None:
                # wait, not gather: a cancelled drain must not cancel the other callers' flusher
                await asyncio.wait([self._flusher])
            else:  # the turn before a batch leaves, or a lone caller's statement
                await asyncio.sleep(0.001)

    def _flush_queued(self) -> None:
        if self._queue and self._flusher is None:
            self._in_flight = True
            self._flusher = asyncio.create_task(self._flush_all(), name="stevora-claim-batch")

    async def _flush_all(self) -> None:
        try:
            while self._queue:
                # One turn first: the threads the last statement woke may have their next claim.
                await asyncio.sleep(0)
                await self._send(self._take_batch())
        finally:
            self._in_flight = False
            self._flusher = None

    def _take_batch(self) -> list[_Pending]:
        """The oldest queued claims, one per run id, at most `max_batch` (the statement locks
        them in id order, skipping any another transaction holds: `transitions.claim_batch`)."""
        batch: dict[str, _Pending] = {}
        rest: list[_Pending] = []
        for item in self._queue:
            if item.done.cancelled():
                continue  # its caller is gone: nothing to claim for it
            if item.run_id in batch or len(batch) >= self.max_batch:
                rest.append(item)
            else:
                batch[item.run_id] = item
        self._queue = rest
        return [batch[run_id] for run_id in sorted(batch)]

    async def _send(self, batch: list[_Pending]) -> None:
        """Claim the runs of `batch` and settle every caller, whatever happens."""
        if not batch:
            return
        retrier = Retrier("claim", workflow_run_id=batch[0].run_id, runs=len(batch))
        while True:
            try:
                if len(batch) == 1:
                    one = await transitions.claim(self.pool, batch[0].run_id, self.owner, self.lease_s)
                    claimed = {} if one is None else {batch[0].run_id: one}
                else:
                    claimed = await transitions.claim_batch(
                        self.pool, [p.run_id for p in batch], self.owner, self.lease_s
                    )
            except Exception as exc:
                if len(batch) > 1 and not is_transient(exc):
                    # One run's reason (or a bug): each caller tries its own statement.
                    for item in batch:
                        _settle(item, Fallback(fast=True, maybe_ours=retrier.outcome_unknown))
                    return
                try:
                    await retrier.pause(exc)  # re-raises when not transient or out of budget
                except Exception as final:
                    for item in batch:
                        if not item.done.done():
                            item.done.set_exception(final)
                    return
                continue
            if len(batch) > 1:
                self.batches += 1
                self.rows += len(batch)
            refused = REFUSED_UNSURE if retrier.outcome_unknown else REFUSED
            for item in batch:
                _settle(item, claimed.get(item.run_id, refused))
            return


def _settle(item: _Pending, value: Claimed | Fallback) -> None:
    if not item.done.done():
        item.done.set_result(value)
