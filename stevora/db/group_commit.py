"""Group commit (prototype): concurrent runs' tool-trace checkpoints in one statement.

Each checkpoint in `checkpoints.py` is one statement and one commit: at concurrency 32 the
worker pays one round trip, one protocol exchange and one WAL flush per checkpoint. Here the
callers that arrive while a batch is in flight wait for the next one, and a batch is written as
**one** data-modifying CTE over `unnest(...)` arrays:

* each row is fenced by *its own* lease: the `UPDATE workflow_runs ... FROM input` bumps the
  event sequence only of runs whose `lease_owner` is the caller's and that are `RUNNING`; a row
  whose fence fails is simply not inserted, and only that caller gets `LeaseLost`;
* the statement is one implicit transaction: all rows of a batch commit together or none does,
  and a caller is woken only after PostgreSQL has acknowledged the commit (with the server's
  `synchronous_commit`, i.e. durable), so a caller never sees a row that is not durable;
* no timer: a batch leaves as soon as the previous one is back, so a lone caller (concurrency 1)
  pays one statement as before, and batches grow only when callers queue up;
* two checkpoints of one run never share a batch (the run's event sequence is bumped once per
  statement per row), the second waits for the next batch;
* if the batch statement fails (a duplicate trace: `uq_tool_trace_call`), each of its callers is
  retried alone, so only the offending caller gets the error.

A SIGKILL of the worker mid-batch kills every caller with it; the batch's transaction either
committed (every row of it is in the tables, resume replays them) or did not (none is, resume
runs those tool calls again: at-least-once handlers, exactly-once records, as today).

Not wired into the tool loop yet: docs/benchmarks.md has the measurements and the integration plan.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import asyncpg

from stevora.db.checkpoints import ToolTraceRecord
from stevora.errors import LeaseLost
from stevora.ids import new_id

_BATCH_TOOL_TRACE_SQL = """
WITH i AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::int[], $7::int[],
                         $8::text[], $9::text[], $10::jsonb[], $11::jsonb[], $12::text[], $13::text[],
                         $14::text[], $15::text[], $16::float8[], $17::text[], $18::text[], $19::text[],
                         $20::jsonb[])
        AS i(run_id, owner, id, step_run_id, llm_call_id, round, sequence, tool_call_id, tool_name,
             input_json, output_json, status, error, error_code, result_text, duration_ms,
             idempotency_key, event_id, event_type, payload)
), r AS (
    UPDATE workflow_runs w SET event_seq = w.event_seq + 1
      FROM i
     WHERE w.id = i.run_id AND w.lease_owner = i.owner AND w.status = 'RUNNING'
 RETURNING w.id, w.event_seq
), t AS (
    INSERT INTO tool_trace (id, workflow_run_id, step_run_id, llm_call_id, round, sequence, tool_call_id,
                            tool_name, input_json, output_json, status, error, error_code, result_text,
                            duration_ms, idempotency_key)
    SELECT i.id, i.run_id, i.step_run_id, i.llm_call_id, i.round, i.sequence, i.tool_call_id, i.tool_name,
           i.input_json, i.output_json, i.status, i.error, i.error_code, i.result_text, i.duration_ms,
           i.idempotency_key
      FROM i JOIN r ON r.id = i.run_id
    RETURNING id
)
INSERT INTO workflow_events (id, workflow_run_id, step_run_id, sequence, event_type, payload)
SELECT i.event_id, i.run_id, i.step_run_id, r.event_seq, i.event_type, i.payload
  FROM i JOIN r ON r.id = i.run_id JOIN t ON t.id = i.id
RETURNING workflow_run_id, sequence
"""


@dataclass(slots=True)
class _Pending:
    run_id: str
    owner: str
    rec: ToolTraceRecord
    event_type: str
    payload: dict[str, Any]
    done: asyncio.Future[int]
    event_id: str


class GroupCommitter:
    """Writes tool-trace checkpoints of concurrent runs in shared statements.

    `await record_tool_trace(...)` returns the event's sequence once the row is committed, or
    raises `LeaseLost` (fence failed) or the database error of its own row.
    """

    def __init__(self, pool: asyncpg.Pool, *, max_batch: int = 256, max_in_flight: int = 1) -> None:
        self.pool = pool
        self.max_batch = max_batch
        # Batches on the wire at once: 2 lets one batch fill while the other is being committed.
        self.max_in_flight = max_in_flight
        self._queue: list[_Pending] = []
        self._flushers: set[asyncio.Task[None]] = set()
        self.batches = 0  # statements sent (for tests and benchmarks)
        self.rows = 0

    async def record_tool_trace(
        self, run_id: str, owner: str, rec: ToolTraceRecord, event_type: str, payload: dict[str, Any]
    ) -> int:
        done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(run_id, owner, rec, event_type, payload, done, new_id("evt")))
        if len(self._flushers) < self.max_in_flight:
            task = asyncio.create_task(self._flush_all(), name="stevora-group-commit")
            self._flushers.add(task)
            task.add_done_callback(self._flushers.discard)
        # shield: a cancelled caller must not cancel the batch other callers share.
        return await asyncio.shield(done)

    async def _flush_all(self) -> None:
        while self._queue:
            batch: list[_Pending] = []
            seen: set[str] = set()
            rest: list[_Pending] = []
            for item in self._queue:
                if item.run_id in seen or len(batch) >= self.max_batch:
                    rest.append(item)
                else:
                    seen.add(item.run_id)
                    batch.append(item)
            self._queue = rest
            await self._write(batch)

    async def _write(self, batch: list[_Pending]) -> None:
        try:
            rows = await self._execute(batch)
        except Exception as exc:  # every caller must be woken, whatever went wrong
            if len(batch) == 1:
                _settle_error(batch[0], exc)
                return
            for item in batch:  # find the culprit: each row alone (the same statement, one row)
                try:
                    rows = await self._execute([item])
                except Exception as one_exc:
                    _settle_error(item, one_exc)
                else:
                    self._settle(item, rows)
            return
        for item in batch:
            self._settle(item, rows)

    async def _execute(self, batch: list[_Pending]) -> dict[str, int]:
        cols: list[list[Any]] = [[] for _ in range(20)]
        for p in batch:
            r = p.rec
            values = (
                p.run_id, p.owner, r.id, r.step_run_id, r.llm_call_id, r.round, r.sequence, r.tool_call_id,
                r.tool_name, r.input_json, r.output_json, r.status, r.error, r.error_code, r.result_text,
                r.duration_ms, r.idempotency_key, p.event_id, p.event_type, p.payload,
            )  # fmt: skip
            for col, value in zip(cols, values, strict=True):
                col.append(value)
        records = await self.pool.fetch(_BATCH_TOOL_TRACE_SQL, *cols)
        self.batches += 1
        self.rows += len(records)
        return {rec["workflow_run_id"]: rec["sequence"] for rec in records}

    @staticmethod
    def _settle(item: _Pending, sequences: dict[str, int]) -> None:
        if item.done.done():
            return
        seq = sequences.get(item.run_id)
        if seq is None:
            item.done.set_exception(
                LeaseLost(
                    f"run {item.run_id}: lease lost before recording tool call {item.rec.idempotency_key}"
                )
            )
        else:
            item.done.set_result(seq)


def _settle_error(item: _Pending, exc: BaseException) -> None:
    if not item.done.done():
        item.done.set_exception(exc)
