"""Group commit (prototype): concurrent runs' checkpoints (model calls, tool calls) in one statement.

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

from stevora.db.checkpoints import LlmCallRecord, ToolTraceRecord
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


_BATCH_LLM_CALL_SQL = """
WITH i AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::int[], $7::text[],
                         $8::text[], $9::text[], $10::jsonb[], $11::jsonb[], $12::jsonb[], $13::int[], $14::int[],
                         $15::int[], $16::int[], $17::float8[], $18::text[], $19::float8[], $20::text[],
                         $21::text[], $22::jsonb[])
        AS i(run_id, owner, id, step_run_id, step_name, round, provider, model, status, request, response,
             error, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, cost_usd,
             finish_reason, duration_ms, event_id, event_type, payload)
), r AS (
    UPDATE workflow_runs w
       SET event_seq = w.event_seq + 1,
           total_cost_cents = w.total_cost_cents + i.cost_usd * 100,
           total_input_tokens = w.total_input_tokens + i.input_tokens,
           total_output_tokens = w.total_output_tokens + i.output_tokens
      FROM i
     WHERE w.id = i.run_id AND w.lease_owner = i.owner AND w.status = 'RUNNING'
 RETURNING w.id, w.event_seq
), c AS (
    INSERT INTO llm_calls (id, workflow_run_id, step_run_id, step_name, round, provider, model, status,
                           request, response, error, finish_reason, input_tokens, output_tokens,
                           cache_read_tokens, cache_write_tokens, cost_usd, duration_ms)
    SELECT i.id, i.run_id, i.step_run_id, i.step_name, i.round, i.provider, i.model, i.status, i.request,
           i.response, i.error, i.finish_reason, i.input_tokens, i.output_tokens, i.cache_read_tokens,
           i.cache_write_tokens, i.cost_usd, i.duration_ms
      FROM i JOIN r ON r.id = i.run_id
    RETURNING id
)
INSERT INTO workflow_events (id, workflow_run_id, step_run_id, sequence, event_type, payload)
SELECT i.event_id, i.run_id, i.step_run_id, r.event_seq, i.event_type, i.payload
  FROM i JOIN r ON r.id = i.run_id JOIN c ON c.id = i.id
RETURNING workflow_run_id, sequence
"""

_SQL = {"tool": _BATCH_TOOL_TRACE_SQL, "llm": _BATCH_LLM_CALL_SQL}


@dataclass(slots=True)
class _Pending:
    run_id: str
    values: tuple[Any, ...]  # the row, in the batch statement's column order
    done: asyncio.Future[int]
    what: str  # for LeaseLost


class GroupCommitter:
    """Writes the checkpoints of concurrent runs in shared statements, one statement per kind.

    `await record_llm_call(...)` / `await record_tool_trace(...)` return the event's sequence
    once the row is committed, or raise `LeaseLost` (fence failed) or the database error of
    their own row. Same arguments as `stevora.db.checkpoints.record_*` minus the pool.
    """

    def __init__(self, pool: asyncpg.Pool, *, max_batch: int = 256, max_in_flight: int = 1) -> None:
        self.pool = pool
        self.max_batch = max_batch
        # Batches on the wire at once (measured: 2 gains nothing, callers arrive in lock-step).
        self.max_in_flight = max_in_flight
        self._queues: dict[str, list[_Pending]] = {kind: [] for kind in _SQL}
        self._flushers: set[asyncio.Task[None]] = set()
        self.batches = 0  # statements sent (for tests and benchmarks)
        self.rows = 0

    async def record_llm_call(
        self, run_id: str, owner: str, rec: LlmCallRecord, event_type: str, payload: dict[str, Any]
    ) -> int:
        values = (
            run_id, owner, rec.id, rec.step_run_id, rec.step_name, rec.round, rec.provider, rec.model,
            rec.status, rec.request, rec.response, rec.error, rec.input_tokens, rec.output_tokens,
            rec.cache_read_tokens, rec.cache_write_tokens, rec.cost_usd, rec.finish_reason, rec.duration_ms,
            new_id("evt"), event_type, payload,
        )  # fmt: skip
        return await self._submit("llm", run_id, values, f"LLM call round {rec.round}")

    async def record_tool_trace(
        self, run_id: str, owner: str, rec: ToolTraceRecord, event_type: str, payload: dict[str, Any]
    ) -> int:
        values = (
            run_id, owner, rec.id, rec.step_run_id, rec.llm_call_id, rec.round, rec.sequence, rec.tool_call_id,
            rec.tool_name, rec.input_json, rec.output_json, rec.status, rec.error, rec.error_code,
            rec.result_text, rec.duration_ms, rec.idempotency_key, new_id("evt"), event_type, payload,
        )  # fmt: skip
        return await self._submit("tool", run_id, values, f"tool call {rec.idempotency_key}")

    async def drain(self) -> None:
        """Wait until every queued checkpoint is written (before closing the pool)."""
        while self._flushers:
            await asyncio.gather(*list(self._flushers), return_exceptions=True)

    async def _submit(self, kind: str, run_id: str, values: tuple[Any, ...], what: str) -> int:
        done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._queues[kind].append(_Pending(run_id, values, done, what))
        if len(self._flushers) < self.max_in_flight:
            task = asyncio.create_task(self._flush_all(), name="stevora-group-commit")
            self._flushers.add(task)
            task.add_done_callback(self._flushers.discard)
        # shield: a cancelled caller must not cancel the batch other callers share.
        return await asyncio.shield(done)

    async def _flush_all(self) -> None:
        while any(self._queues.values()):
            for kind, queue in self._queues.items():
                if not queue:
                    continue
                batch: list[_Pending] = []
                seen: set[str] = set()
                rest: list[_Pending] = []
                for item in queue:
                    if item.run_id in seen or len(batch) >= self.max_batch:
                        rest.append(item)
                    else:
                        seen.add(item.run_id)
                        batch.append(item)
                self._queues[kind] = rest
                await self._write(kind, batch)

    async def _write(self, kind: str, batch: list[_Pending]) -> None:
        try:
            rows = await self._execute(kind, batch)
        except Exception as exc:  # every caller must be woken, whatever went wrong
            if len(batch) == 1:
                _settle_error(batch[0], exc)
                return
            for item in batch:  # find the culprit: each row alone (the same statement, one row)
                try:
                    rows = await self._execute(kind, [item])
                except Exception as one_exc:
                    _settle_error(item, one_exc)
                else:
                    _settle(item, rows)
            return
        for item in batch:
            _settle(item, rows)

    async def _execute(self, kind: str, batch: list[_Pending]) -> dict[str, int]:
        columns = [list(col) for col in zip(*(p.values for p in batch), strict=True)]
        records = await self.pool.fetch(_SQL[kind], *columns)
        self.batches += 1
        self.rows += len(records)
        return {rec["workflow_run_id"]: rec["sequence"] for rec in records}


def _settle(item: _Pending, sequences: dict[str, int]) -> None:
    if item.done.done():
        return
    seq = sequences.get(item.run_id)
    if seq is None:
        item.done.set_exception(LeaseLost(f"run {item.run_id}: lease lost before recording {item.what}"))
    else:
        item.done.set_result(seq)


def _settle_error(item: _Pending, exc: BaseException) -> None:
    if not item.done.done():
        item.done.set_exception(exc)
