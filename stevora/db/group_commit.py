"""Group commit: concurrent runs' checkpoints (model calls, tool calls) and endings in one statement.

Written singly, each checkpoint is one statement and one commit: at concurrency 32 the worker
pays one round trip, one protocol exchange and one WAL flush per checkpoint. The `Runtime` owns
one `GroupCommitter`; callers that arrive while a batch is in flight wait for the next one, and a
batch is **one** statement over a JSON array of rows (`jsonb_to_recordset`, `checkpoint_sql.py`):

* each row is fenced by *its own* lease: a row whose fence fails is not written, and only that
  caller gets `LeaseLost`;
* the statement is one implicit transaction: all rows of a batch commit together or none does,
  and callers are woken only after PostgreSQL acknowledged the commit (`synchronous_commit` as
  the server has it, never `off`), so no caller goes on from a row that is not durable;
* no timer: a batch leaves as soon as the previous one is back; a caller that finds nothing in
  flight waits one turn of the event loop (callers of that same turn join it) and, still alone,
  sends its single-row statement from its own task, so concurrency 1 pays what it always paid
  (after `CALM_WRITES` lone checkpoints in a row that nobody joined, it skips that turn until a
  caller arrives while a statement is in flight again); batches grow only when callers queue
  up, and are sent by a flusher task that no caller's cancellation (a revoked lease cancels
  that run's task) can interrupt; before each statement it sends, the flusher waits one turn
  of the loop, so the callers its last statement woke (their next checkpoint is usually one
  turn away) join this statement instead of the next one;
* two checkpoints of one run never share a batch (the run's event sequence is bumped once per
  row), the second waits for the next one;
* a lost connection retries the batch in place (same rows, same ids): the try whose outcome was
  unknown may have committed, so a unique violation on a *retry* means "already recorded"; the
  batch then falls back to its rows one by one, each counted as a retry, so each caller learns
  its own row's fate;
* a batch that fails for one row's reason (a duplicate trace on a first try, bad data) is retried
  row by row, so only the offending caller gets the error;
* when model calls and tool calls are both queued (of different runs: a run's checkpoints follow
  each other), one statement writes both batches (`checkpoint_sql.PAIR_SQL`): one commit instead
  of two. Its rows commit together as a batch's do; a lost connection retries it in place, and an
  error that is one row's writes each kind's batch on its own, with the rules above;
* a third kind of row is a run's completion (`transitions.COMPLETION`: its last step and the run
  completed, their events and webhook outbox rows), so runs that end together share a statement
  too. Its batch goes out after the pair, in the same turn of the flusher, so a steady stream of
  checkpoints never starves it. A completion's own first try releases the run's lease, so a retry
  after a lost connection finds it fenced out by that write: such a row is settled with
  `FencedAfterUnknownOutcome` (a `LeaseLost`), and its caller reads which it was.

A SIGKILL of the worker mid-batch kills every caller with it; the batch's transaction either
committed (all its rows are in the tables, resume replays them) or did not (none is, resume runs
those calls again: at-least-once handlers, exactly-once records). Fault points for crash tests,
reached only for statements carrying several rows of a kind, with `<kind>` `llm_call`,
`tool_trace` or `completion` and `<n>` the how-many-th such statement for that kind (a statement of both kinds
reaches the points of each kind it carries several rows of): `batch_sending:<kind>:<n>` (callers queued, nothing sent),
`batch_sent:<kind>:<n>` (the statement is handed to the connection, its result not read) and
`batch_committed:<kind>:<n>` (committed, no caller woken yet).

`STEVORA_GROUP_COMMIT=false` turns grouping off: each checkpoint is then written by its own
caller, concurrently, with the same statement shape and the same retry rules.

Grouping on, one statement is in flight at a time, so the committer keeps one pool connection
between statements instead of acquiring and releasing one for each (asyncpg's acquire + release
is about 60 Python calls and a task per statement, more than the rest of a lone checkpoint's
client side). It is given back after `HOLD_IDLE_S` without a checkpoint, by `drain()`, and at
once after any error that is not a plain statement error (a lost connection, a cancelled
statement: terminated first, so no half-finished protocol state is ever reused). A pool of one
connection is never held.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import asyncpg
import structlog

from stevora.db.checkpoint_sql import LLM_CALL, PAIR_SQL, TOOL_TRACE, CheckpointKind
from stevora.db.database import dumps
from stevora.db.transient import Retrier, is_transient
from stevora.errors import LeaseLost
from stevora.faults import FaultPlan

ALREADY_RECORDED: Any = object()  # a retry found the row written by the try before


class FencedAfterUnknownOutcome(LeaseLost):
    """A row's fence failed on a try after one whose outcome was unknown (its connection was
    lost): that earlier try may have written it. A checkpoint's retry finds its own row by its
    unique key instead (ALREADY_RECORDED); a run's completion, whose first try releases the lease,
    is fenced out by its own write, and its caller reads which it was
    (stevora.db.transitions.complete_last_step)."""


log = structlog.get_logger("stevora.db")
HOLD_IDLE_S = 0.25
# After this many lone checkpoints in a row that no other caller joined, a lone caller sends at
# once instead of first waiting one loop turn for company.
CALM_WRITES = 16  # a kept connection goes back to the pool after this long without a checkpoint


@dataclass(slots=True)
class _Pending:
    run_id: str
    values: tuple[Any, ...]  # the row, in the statement's parameter order
    done: asyncio.Future[Any]
    what: str  # for LeaseLost


class GroupCommitter:
    """Writes checkpoints of concurrent runs in shared statements; see the module docstring.

    `await write(kind, run_id, values, what)` returns the statement's row for it (its event's
    `created_at`, the run's `pending_messages`) once it is durable, `ALREADY_RECORDED` when a
    retry found it written, or raises
    `LeaseLost` (its fence failed) or the database error of its own row.
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        enabled: bool = True,
        faults: FaultPlan | None = None,
        max_batch: int = 256,
    ) -> None:
        self.pool = pool
        self.enabled = enabled
        self.faults = faults or FaultPlan(None)
        self.max_batch = max_batch
        self._queues: dict[CheckpointKind, list[_Pending]] = {}
        self._queued = 0  # rows in all queues (so that "alone" and "anything queued" need no scan)
        self._flusher: asyncio.Task[None] | None = None
        self._in_flight = False  # a statement is on the wire (a lone caller's or the flusher's)
        self._calm = 0  # lone checkpoints in a row that nobody joined (see `write`)
        self.batches = 0  # statements that committed (for tests and benchmarks)
        self.rows = 0
        self._multi_row: dict[str, int] = {}  # batches of several rows sent, per kind (fault points)
        # The kept connection (see the module docstring); only a real pool of 2+ connections.
        self._hold = enabled and isinstance(pool, asyncpg.Pool) and pool.get_max_size() > 1
        self._conn: Any = None
        self._conn_used = False  # a statement went out since the last idle check
        self._idle_timer: asyncio.TimerHandle | None = None
        self._releasing: set[asyncio.Task[None]] = set()

    async def write(self, kind: CheckpointKind, run_id: str, values: tuple[Any, ...], what: str) -> Any:
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        item = _Pending(run_id, values, done, what)
        if not self.enabled:
            await self._write(kind, [item])
            return done.result()
        queue = self._queues.setdefault(kind, [])
        queue.append(item)
        self._queued += 1
        if self._in_flight:
            self._calm = 0  # callers meet: wait a turn for company again
            # The flusher task sends queued rows; this caller only waits for its own future, so
            # cancelling it (a revoked lease) cancels that future, never the batch others share
            # (the flusher does not settle a cancelled future). No `shield`: it cost a task-like
            # wrapper and three callbacks per checkpoint.
            return await done
        # Nothing in flight. After one turn of the loop (callers of this same turn join the queue),
        # a caller still alone sends its row itself, from its own task: no task switch, no timer,
        # one single-row statement. Rows of several callers go to the flusher task instead, so
        # that cancelling one caller (a revoked lease) can never cancel the others' statement.
        self._in_flight = True
        if self._calm < CALM_WRITES:
            try:
                await asyncio.sleep(0)
            except BaseException:
                queue.remove(item)  # cancelled before anything was sent
                self._queued -= 1
                self._in_flight = False
                self._flush_queued()
                raise
        # else: the last CALM_WRITES checkpoints all went alone, nobody arriving while they were
        # in flight (one run, or runs that never overlap): the turn would only cost a wake-up.
        # A caller that does arrive meanwhile is queued for the next statement and resets this.
        if self._queued == 1:  # alone: this row is the only one queued, of any kind
            self._queues[kind] = []
            self._queued = 0
            try:
                await self._write(kind, queue)
            finally:
                self._in_flight = False
                # Calm when nobody queued up behind this statement.
                self._calm = 0 if self._queued and self._flush_queued() else self._calm + 1
            return done.result()
        self._in_flight = False
        self._flush_queued()
        return await done  # sent by the flusher (see above)

    async def drain(self) -> None:
        """Wait until every queued checkpoint is written and the kept connection is back in the
        pool (before the pool closes)."""
        while self._flusher is not None:
            await asyncio.gather(self._flusher, return_exceptions=True)
        if not self._in_flight:
            self._give_back(terminate=False)
        while self._releasing:
            await asyncio.gather(*self._releasing, return_exceptions=True)

    # -- the kept connection ----------------------------------------------------------------------

    async def _fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        """One statement: on the kept connection when grouping (one statement in flight at a
        time), else on a connection of the pool's."""
        if not self._hold:
            return await self.pool.fetch(sql, *args)  # type: ignore[no-any-return]
        conn = self._conn
        statement = None
        if conn is not None:
            try:
                statement = conn.fetch(sql, *args)
            except asyncpg.InterfaceError:
                # The server closed it while it was kept, and asyncpg gave it back to the pool
                # (a released connection refuses calls before sending anything): take another.
                self._conn = conn = None
        if conn is None:
            conn = self._conn = await self.pool.acquire()
            if self._idle_timer is None:
                self._idle_timer = asyncio.get_running_loop().call_later(HOLD_IDLE_S, self._idle_check)
        self._conn_used = True
        try:
            if statement is None:
                statement = conn.fetch(sql, *args)
            return await statement  # type: ignore[no-any-return]
        except BaseException as exc:
            if not isinstance(exc, asyncpg.PostgresError) or is_transient(exc):
                # A lost connection, a cancelled statement, anything not a plain statement error:
                # never reuse it (a plain error, e.g. a unique violation, leaves it idle and fine).
                self._give_back(terminate=True)
            raise

    def _idle_check(self) -> None:
        self._idle_timer = None
        if self._conn is None:
            return
        if self._conn_used or self._in_flight:
            self._conn_used = False
            self._idle_timer = asyncio.get_running_loop().call_later(HOLD_IDLE_S, self._idle_check)
            return
        self._give_back(terminate=False)

    def _give_back(self, *, terminate: bool) -> None:
        conn, self._conn = self._conn, None
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        if conn is None:
            return
        if terminate:
            # A connection the server closed is already back in the pool (asyncpg releases it).
            with contextlib.suppress(asyncpg.InterfaceError):
                conn.terminate()
        task = asyncio.ensure_future(self.pool.release(conn))
        self._releasing.add(task)
        task.add_done_callback(self._released)

    def _released(self, task: asyncio.Task[None]) -> None:
        self._releasing.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("group_commit_release_failed", error=repr(task.exception()))

    def _flush_queued(self) -> bool:
        """Start the flusher for queued rows, if any (returns whether there were)."""
        if self._queued:
            self._in_flight = True
            self._flusher = asyncio.create_task(self._flush_all(), name="stevora-group-commit")
            return True
        return False

    async def _flush_all(self) -> None:
        try:
            while self._queued:
                # One turn of the loop first: the callers the last statement woke write their
                # next checkpoint meanwhile and join this one (fewer, larger statements).
                await asyncio.sleep(0)
                if self._queues.get(LLM_CALL) and self._queues.get(TOOL_TRACE):
                    # Both kinds queued: one statement for both (`PAIR_SQL`), runs not shared.
                    calls = self._take_batch(LLM_CALL)
                    tools = self._take_batch(TOOL_TRACE, frozenset(p.run_id for p in calls))
                    if tools:
                        await self._write_pair(calls, tools)
                    else:
                        await self._write(LLM_CALL, calls)
                    # Then any other kind queued (runs' completions), so that a steady stream of
                    # both checkpoint kinds never starves it.
                    for kind in list(self._queues):
                        if kind is not LLM_CALL and kind is not TOOL_TRACE and self._queues[kind]:
                            await self._write(kind, self._take_batch(kind))
                    continue
                for kind in list(self._queues):
                    if self._queues[kind]:
                        await self._write(kind, self._take_batch(kind))
        finally:
            self._in_flight = False
            self._flusher = None

    def _take_batch(self, kind: CheckpointKind, taken: frozenset[str] = frozenset()) -> list[_Pending]:
        """The queue's oldest rows, at most one per run (its event sequence is bumped once per row)
        and none of a run in `taken` (rows of the other kind sent in the same statement)."""
        queue = self._queues[kind]
        if len(queue) == 1 and queue[0].run_id not in taken:  # a lone caller
            self._queues[kind] = []
            self._queued -= 1
            return queue
        batch: list[_Pending] = []
        seen: set[str] = set(taken)
        rest: list[_Pending] = []
        for item in queue:
            if item.run_id in seen or len(batch) >= self.max_batch:
                rest.append(item)
            else:
                seen.add(item.run_id)
                batch.append(item)
        self._queues[kind] = rest
        self._queued -= len(batch)
        # A stable order for the batch's rows (the statement's own row locks follow its plan; a
        # deadlock with the heartbeat is rolled back and retried, as any 40P01).
        batch.sort(key=_RUN_ID)
        return batch

    async def _write(self, kind: CheckpointKind, batch: list[_Pending], *, retried: bool = False) -> None:
        """Write `batch` and settle every caller of it, whatever happens. `retried`: an earlier
        try of these rows had an unknown outcome (a unique violation then means "recorded")."""
        retrier: Retrier | None = None  # made on a first failure: most writes never need one
        lone = len(batch) == 1
        while True:
            try:
                if lone:  # its statement straight from here (a frame less)
                    records = await self._fetch(kind.single_sql, *batch[0].values)
                else:
                    records = await self._execute_batch(kind, batch)
            except Exception as exc:
                if retrier is None:
                    retrier = Retrier(f"record_{kind.name}", rows=len(batch), workflow_run_id=batch[0].run_id)
                again = retried or retrier.outcome_unknown
                if not lone and not is_transient(exc):
                    # One row's reason (or a retry's unique violation): each row alone.
                    for item in batch:
                        await self._write(kind, [item], retried=again)
                    return
                if again and isinstance(exc, asyncpg.UniqueViolationError):
                    _settle(batch[0], ALREADY_RECORDED)  # the try whose outcome was unknown did commit
                    return
                try:
                    await retrier.pause(exc)  # re-raises when not transient or out of budget
                except Exception as final:
                    for item in batch:
                        _settle_error(item, final)
                    return
                continue
            self.batches += 1
            self.rows += len(records)
            if lone:
                # The lone row's statement returns its row, or none when its fence failed.
                item = batch[0]
                if not records:
                    _settle_error(item, _lease_lost(item, _unknown(retried, retrier)))
                elif not item.done.done():  # `_settle`, inlined: once per checkpoint
                    item.done.set_result(records[0])
                return
            if self.faults.armed:
                self.faults.reached("batch_committed", kind.name, self._multi_row[kind.name])
            _settle_committed(batch, records, _unknown(retried, retrier))
            return

    async def _write_pair(self, calls: list[_Pending], tools: list[_Pending]) -> None:
        """Write a batch of model calls and one of tool calls (of other runs) in one statement and
        settle every caller. On an error that is one row's (not transient), each kind's batch is
        written on its own, with `_write`'s rules (a retry's unique violation included)."""
        retrier: Retrier | None = None
        while True:
            try:
                records = await self._execute_pair(calls, tools)
            except Exception as exc:
                again = retrier is not None and retrier.outcome_unknown
                if not is_transient(exc):
                    await self._write(LLM_CALL, calls, retried=again)
                    await self._write(TOOL_TRACE, tools, retried=again)
                    return
                if retrier is None:
                    retrier = Retrier(
                        "record_checkpoints", rows=len(calls) + len(tools), workflow_run_id=calls[0].run_id
                    )
                try:
                    await retrier.pause(exc)
                except Exception as final:
                    for item in (*calls, *tools):
                        _settle_error(item, final)
                    return
                continue
            self.batches += 1
            self.rows += len(records)
            if self.faults.armed:  # the points of each kind it carried several rows of, as `_write`
                for kind, batch in ((LLM_CALL, calls), (TOOL_TRACE, tools)):
                    if len(batch) > 1:
                        self.faults.reached("batch_committed", kind.name, self._multi_row[kind.name])
            _settle_committed([*calls, *tools], records, _unknown(False, retrier))
            return

    async def _execute_pair(self, calls: list[_Pending], tools: list[_Pending]) -> list[asyncpg.Record]:
        docs = (_document(LLM_CALL, calls), _document(TOOL_TRACE, tools))
        if self.faults.armed:
            return await self._execute_with_faults((LLM_CALL, TOOL_TRACE), PAIR_SQL, docs)
        return await self._fetch(PAIR_SQL, *docs)

    async def _execute_batch(self, kind: CheckpointKind, batch: list[_Pending]) -> list[asyncpg.Record]:
        """One statement for the rows of several runs; returns the rows written (run id and
        commit timestamp and pending messages each)."""
        rows = _document(kind, batch)
        if self.faults.armed:
            return await self._execute_with_faults((kind,), kind.batch_sql, (rows,))
        return await self._fetch(kind.batch_sql, rows)

    async def _execute_with_faults(
        self, kinds: tuple[CheckpointKind, ...], sql: str, docs: tuple[list[dict[str, Any]], ...]
    ) -> list[asyncpg.Record]:
        """The statement, with the fault points of each kind of which it carries several rows."""
        marked = []
        for kind, doc in zip(kinds, docs, strict=True):
            if len(doc) > 1:
                n = self._multi_row[kind.name] = self._multi_row.get(kind.name, 0) + 1
                marked.append((kind.name, n))
        for name, n in marked:
            self.faults.reached("batch_sending", name, n)
        async with self.pool.acquire() as conn:
            sent = asyncio.ensure_future(conn.fetch(sql, *docs))
            await asyncio.sleep(0)  # the task runs up to its first wait: the statement is on its way
            for name, n in marked:
                self.faults.reached("batch_sent", name, n)
            records: list[asyncpg.Record] = await sent
            return records


def _document(kind: CheckpointKind, batch: list[_Pending]) -> list[dict[str, Any]]:
    """The batch's rows as its statement's JSON document: one object per row, keyed by input."""
    names = kind.names
    rows = [dict(zip(names, p.values, strict=True)) for p in batch]
    for n in kind.json_text:  # a `json` column: its JSON text, as a string (checkpoint_sql)
        name = names[n]
        for row in rows:
            if row[name] is not None:
                row[name] = dumps(row[name])
    return rows


_RUN_ID = attrgetter("run_id")


def _unknown(retried: bool, retrier: Retrier | None) -> bool:
    """Whether a try of these rows before the one that just committed may have committed too."""
    return retried or (retrier is not None and retrier.outcome_unknown)


def _lease_lost(item: _Pending, retried: bool) -> LeaseLost:
    """`retried`: a try before this one may have committed (`FencedAfterUnknownOutcome`)."""
    lost = FencedAfterUnknownOutcome if retried else LeaseLost
    return lost(f"run {item.run_id}: lease lost before recording {item.what}")


def _settle_committed(batch: list[_Pending], records: list[asyncpg.Record], retried: bool) -> None:
    """Each caller of a committed batch gets its row, or LeaseLost when its fence failed."""
    committed = {rec["workflow_run_id"]: rec for rec in records}
    for item in batch:
        found = committed.get(item.run_id)
        if found is None:
            _settle_error(item, _lease_lost(item, retried))
        elif not item.done.done():
            item.done.set_result(found)


def _settle(item: _Pending, value: Any) -> None:
    if not item.done.done():
        item.done.set_result(value)


def _settle_error(item: _Pending, exc: BaseException) -> None:
    if not item.done.done():
        item.done.set_exception(exc)
