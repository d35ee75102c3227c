"""The two fixed transitions of every run, each as one statement (data-modifying CTEs).

A run's fixed cost used to be four transactions (start, begin the first step, complete the last
step, complete the run) of 4 to 6 round trips each. The first two and the last two always follow
each other, so each pair is now one statement, which is its own transaction: one round trip and
one commit instead of five or six. They keep every guard of the separate writes in `runs`:

* the run's write is fenced by `lease_owner` and its expected status, the step's by its expected
  status; zero rows back means nothing was written, and the caller gets `LeaseLost` or
  `InvalidStateTransition` exactly as from `runs.update_run` / `runs.update_step`;
* the events take their sequences from the `event_seq` the same statement increments, so they
  stay gap-free and in commit order;
* the completion writes the webhook outbox rows in the same statement as the run's ending;
* runs whose completions arrive together share one such statement and its commit, through the
  group committer (`COMPLETION`, its third kind of row), each row under its own guards.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import asyncpg

from stevora.clock import iso, utcnow
from stevora.db import concurrency
from stevora.db.checkpoint_sql import CheckpointKind, pending_messages
from stevora.db.group_commit import ALREADY_RECORDED, FencedAfterUnknownOutcome, GroupCommitter
from stevora.db.outbox import deliveries_sql
from stevora.db.runs import RUN_COLUMNS, RUNNABLE, STEP_COLUMNS
from stevora.errors import InvalidStateTransition, LeaseLost
from stevora.events import EventType, WebhookEvent
from stevora.ids import new_id
from stevora.statuses import RunStatus, StepStatus


def _qualified(columns: str, alias: str) -> str:
    return ", ".join(f"{alias}.{c.strip()}" for c in columns.split(","))


_STEP_FIELDS = [c.strip() for c in STEP_COLUMNS.split(",")]
# The first step run a claim inserts, made from the claim's row `c` (its columns not named here
# are NULL). The statement returns the same values as `s_<column>` instead of joining the
# inserted rows back: one row per run claimed, with no join whatever the number of runs.
_NEW_STEP = {
    "id": "c.current_step_run_id",
    "workflow_run_id": "c.id",
    "step_name": "c.current_step_name",
    "step_type": "c.first_step_type",
    "step_index": "0",
    "visit": "1",
    "attempt": "1",
    "status": "'RUNNING'",
    "started_at": "c.started_at",
    "created_at": "c.started_at",
}
_NEW_STEP_AS = ", ".join(f"{_NEW_STEP.get(c, 'NULL')} AS s_{c}" for c in _STEP_FIELDS)
_PENDING = "w.status = 'PENDING'"


# The claim (the lease, taken if the run is free and has something to do now) that also starts
# a PENDING run: run → RUNNING, its first step run (the definition's first step) inserted
# RUNNING, WORKFLOW_STARTED then STEP_STARTED — what used to be a claim and two transactions
# (`_start`, `_begin`). SET sees the row as it was, so `w.status = 'PENDING'` picks the branch;
# `started` tells the other sub-statements which branch was taken (they cannot see the update).
# The start is dated by clock_timestamp(), read after the statement's snapshot, not by now(): a
# slot claim's transaction begins before it waits for its key's lock (stevora.engine.flow), so
# now() could date the start before the ending of the run whose slot it took.
#
# `batch`: the same claim of several runs at once, each run fenced on its own; one row back per
# run claimed. $1 is the runs' ids (an index condition) and $4 a JSON
# object of each run's new ids, `{run id: [step run, WORKFLOW_STARTED, STEP_STARTED]}`: a key
# lookup per row, so no join of the runs with their ids (the planner, which knows nothing of an
# array's length, ran such a join as a nested loop comparing every run with every other). The
# step run and the events are made from `c`'s own rows, never joined back either.
#
# A batch locks its runs first, in id order, skipping any another transaction holds: an UPDATE
# locks rows in whatever order its plan reads them, so two overlapping batches (a duplicate
# message, a sweep's redispatch) could deadlock; and one row held elsewhere would stall every run
# of the batch. A run skipped is refused and claimed on its own (stevora.engine.flow), waiting for
# its lock there. `ARRAY(SELECT …)` hands the update the locked ids as one array (an index
# condition), not as a relation to join.
_LOCKED_IN_ID_ORDER = """locked AS (
    SELECT id FROM workflow_runs WHERE id = ANY($1::text[]) ORDER BY id FOR NO KEY UPDATE SKIP LOCKED
), """


def _claim_sql(fence: str, *, batch: bool = False) -> str:
    if batch:
        run_id, step_run_id = "ANY(ARRAY(SELECT id FROM locked))", "($4::jsonb -> w.id ->> 0)"
        new_ids = ", $4::jsonb -> w.id AS new_ids"
        started_event, step_event = "c.new_ids ->> 1", "c.new_ids ->> 2"
        locked = _LOCKED_IN_ID_ORDER
    else:
        run_id, step_run_id, new_ids, started_event, step_event = "$1", "$4", "", "$5", "$6"
        locked = ""
    return f"""
WITH {locked}c AS (
    UPDATE workflow_runs w SET lease_owner = $2, lease_expires_at = now() + make_interval(secs => $3),
           version = w.version + 1,
           status = CASE WHEN {_PENDING} THEN 'RUNNING' ELSE w.status END,
           current_step_name = CASE WHEN {_PENDING} THEN d.steps->0->>'name' ELSE w.current_step_name END,
           current_step_run_id = CASE WHEN {_PENDING} THEN {step_run_id} ELSE w.current_step_run_id END,
           started_at = CASE WHEN {_PENDING} THEN clock_timestamp() ELSE w.started_at END,
           next_run_at = CASE WHEN {_PENDING} THEN NULL ELSE w.next_run_at END,
           updated_at = CASE WHEN {_PENDING} THEN now() ELSE w.updated_at END,
           event_seq = w.event_seq + CASE WHEN {_PENDING} THEN 2 ELSE 0 END,
           -- Taking over an expired lease: its holder died (or crashed) with the run (poison.py).
           crash_count = w.crash_count
               + CASE WHEN w.lease_owner IS NOT NULL AND w.lease_expires_at < now() THEN 1 ELSE 0 END
    FROM workflow_definitions d
    WHERE w.id = {run_id} AND {fence} AND d.id = w.definition_id
    RETURNING {_qualified(RUN_COLUMNS, "w")}, w.dispatched_at, w.trace_context, w.event_seq,
              w.replay_of, w.replay_tools,
              w.current_step_run_id IS NOT DISTINCT FROM {step_run_id} AS started,
              d.steps->0->>'type' AS first_step_type,
              {pending_messages("w")}{new_ids}
), s AS (
    INSERT INTO step_runs ({", ".join(_NEW_STEP)}) SELECT {", ".join(_NEW_STEP.values())} FROM c WHERE c.started
), e AS (
    INSERT INTO workflow_events (id, workflow_run_id, step_run_id, sequence, event_type, payload, created_at)
    SELECT {started_event}, c.id, NULL, c.event_seq - 1, '{EventType.WORKFLOW_STARTED}', '{{}}'::jsonb, c.started_at
    FROM c WHERE c.started
    UNION ALL
    SELECT {step_event}, c.id, c.current_step_run_id, c.event_seq, '{EventType.STEP_STARTED}',
           jsonb_build_object('stepName', c.current_step_name, 'stepType', c.first_step_type,
                              'attempt', 1, 'visit', 1),
           c.started_at
    FROM c WHERE c.started
)
SELECT c.*, {_NEW_STEP_AS} FROM c
"""


# The claim of a run that needs no slot and is not outranked (stevora.db.concurrency); a run it
# refuses for those reasons is claimed by stevora.engine.flow with one of the other two.
_CLAIM_SQL = _claim_sql(f"{RUNNABLE} AND {concurrency.FAST_FENCE}")
_BATCH_CLAIM_SQL = _claim_sql(f"{RUNNABLE} AND {concurrency.FAST_FENCE}", batch=True)
_SLOT_CLAIM_SQL = _claim_sql(f"{RUNNABLE} AND {concurrency.SLOT_FENCE}")
_PLAIN_CLAIM_SQL = _claim_sql(f"{RUNNABLE} AND {concurrency.PLAIN_FENCE}")
# A PENDING run whose lease this worker holds already (claimed by a worker that did not start
# runs in its claim): the same start, fenced by the lease instead of taking it.
_START_SQL = _claim_sql(f"{_PENDING} AND w.lease_owner = $2")


async def claim(
    pool: asyncpg.Pool, run_id: str, owner: str, lease_s: float
) -> tuple[asyncpg.Record, dict[str, Any] | None] | None:
    """Take the run's lease if it is free and the run has something to do now; a PENDING run is
    started by the same statement. Returns (run row, its first step run row if this claim
    started it), or None when the run is not ours to take."""
    return await _claim(_CLAIM_SQL, pool, run_id, owner, lease_s)


async def claim_batch(
    pool: asyncpg.Pool, run_ids: list[str], owner: str, lease_s: float
) -> dict[str, tuple[asyncpg.Record, dict[str, Any] | None]]:
    """`claim` of several runs in one statement (one commit), each run fenced on its own: the
    runs claimed, by id, each with what `claim` returns for it. A run missing from the result was
    refused (not ours to take now, or it needs a slot or is outranked: stevora.engine.flow)."""
    new_ids = {run_id: (new_id("srun"), new_id("evt"), new_id("evt")) for run_id in run_ids}
    rows = await pool.fetch(_BATCH_CLAIM_SQL, run_ids, owner, lease_s, new_ids)
    return {row["id"]: _claimed(row) for row in rows}


async def claim_with_slot(
    conn: asyncpg.Connection, run_id: str, owner: str, lease_s: float
) -> tuple[asyncpg.Record, dict[str, Any] | None] | None:
    """`claim` of a run that needs a slot, if one is free; in the caller's transaction, which
    holds the slot's advisory locks (stevora.engine.flow)."""
    return await _claim(_SLOT_CLAIM_SQL, conn, run_id, owner, lease_s)


async def claim_plain(
    pool: asyncpg.Pool, run_id: str, owner: str, lease_s: float
) -> tuple[asyncpg.Record, dict[str, Any] | None] | None:
    """`claim` of a run that needs no slot, even when a run of higher priority waits."""
    return await _claim(_PLAIN_CLAIM_SQL, pool, run_id, owner, lease_s)


async def start(
    pool: asyncpg.Pool, run_id: str, owner: str, lease_s: float
) -> tuple[asyncpg.Record, dict[str, Any]]:
    """Start a PENDING run this worker holds the lease of; returns (run row, first step run row)."""
    claimed = await _claim(_START_SQL, pool, run_id, owner, lease_s)
    if claimed is None or claimed[1] is None:
        raise LeaseLost(f"run {run_id} is no longer leased by this worker in status ['PENDING']")
    return claimed[0], claimed[1]


async def _claim(
    sql: str, pool: asyncpg.Pool | asyncpg.Connection, run_id: str, owner: str, lease_s: float
) -> tuple[asyncpg.Record, dict[str, Any] | None] | None:
    row = await pool.fetchrow(sql, run_id, owner, lease_s, new_id("srun"), new_id("evt"), new_id("evt"))
    return None if row is None else _claimed(row)


def _claimed(row: asyncpg.Record) -> tuple[asyncpg.Record, dict[str, Any] | None]:
    return row, ({c: row[f"s_{c}"] for c in _STEP_FIELDS} if row["started"] else None)


# The last step RUNNING → COMPLETED and the run RUNNING → COMPLETED (lease released, output = the
# final state) with STEP_COMPLETED, WORKFLOW_COMPLETED and the webhook outbox rows, over an input
# relation `ending` of one row per run: one row with its parameters in place (a lone completion, or
# one in its caller's transaction), or a batch (one jsonb document, one object per run) sent by
# the group committer for runs that end together (docs/architecture.md, "Runs that end
# together"). `guard` locks both rows of each run, in run id order, and checks both guards
# first: the sub-statements of one statement do not see each other's writes, so without it a
# lost lease could still complete the step (or a step that is no longer RUNNING could still
# complete the run). With both rows locked by the
# guard, the two updates cannot miss; a run whose guard fails writes nothing and is missing from
# the result. Each sub-statement carries the input columns it needs in its RETURNING instead of
# joining back on `ending` (linear in the rows, see stevora.db.checkpoint_sql).
_COMPLETION_INPUTS = (
    ("run_id", "text"),
    ("owner", "text"),
    ("step_run_id", "text"),
    ("output", "jsonb"),
    ("state_updates", "jsonb"),
    ("step_event_id", "text"),
    ("run_event_id", "text"),
    ("webhook_event_id", "text"),
    ("announced_at", "text"),
)
_MERGED_STATE = "CASE WHEN s.state_updates IS NULL THEN w.state ELSE COALESCE(w.state, '{}'::jsonb) || s.state_updates END"
_COMPLETE = f"""
WITH ending AS (
    {{input}}
), guard AS (
    SELECT i.* FROM ending i JOIN workflow_runs w ON w.id = i.run_id JOIN step_runs st ON st.id = i.step_run_id
    WHERE st.workflow_run_id = w.id AND w.status = 'RUNNING' AND w.lease_owner = i.owner
      AND st.status = 'RUNNING'
    ORDER BY w.id
    FOR NO KEY UPDATE OF w, st
), s AS (
    UPDATE step_runs st SET status = 'COMPLETED', output = g.output, state_updates = g.state_updates,
                        updated_at = now(), completed_at = now()
    FROM guard g WHERE st.id = g.step_run_id
    RETURNING g.*, st.step_name, st.started_at, st.completed_at
), r AS (
    UPDATE workflow_runs w SET version = version + 1, updated_at = now(), event_seq = event_seq + 2,
           status = 'COMPLETED', current_step_name = NULL, next_run_at = NULL, lease_owner = NULL,
           lease_expires_at = NULL, completed_at = now(), state = {_MERGED_STATE}, output = {_MERGED_STATE}
    FROM s WHERE w.id = s.run_id
    RETURNING {_qualified(RUN_COLUMNS, "w")}, w.event_seq, w.total_cost_cents,
              s.step_name AS s_step_name,
              GREATEST(0, floor(extract(epoch FROM s.completed_at - s.started_at) * 1000))::int AS s_duration_ms,
              s.step_run_id AS s_step_run_id, s.step_event_id, s.run_event_id, s.webhook_event_id, s.announced_at
), e AS (
    INSERT INTO workflow_events (id, workflow_run_id, step_run_id, sequence, event_type, payload)
    SELECT r.step_event_id, r.id, r.s_step_run_id, r.event_seq - 1, '{EventType.STEP_COMPLETED}',
           jsonb_build_object('stepName', r.s_step_name, 'durationMs', COALESCE(r.s_duration_ms, 0)) FROM r
    UNION ALL
    SELECT r.run_event_id, r.id, NULL, r.event_seq, '{EventType.WORKFLOW_COMPLETED}', '{{}}'::jsonb FROM r
), o AS (
    {
    deliveries_sql(
        workspace="r.workspace_id",
        event=f"'{WebhookEvent.WORKFLOW_COMPLETED}'::text",
        event_id="r.webhook_event_id",
        created_at="r.announced_at",
        data=(
            "jsonb_build_object('workflowRunId', r.id, 'status', "
            f"'{RunStatus.COMPLETED}', 'output', r.state, 'totalCostCents', r.total_cost_cents)"
        ),
        source="r",
    )
}
)
SELECT r.id AS workflow_run_id, {_qualified(RUN_COLUMNS, "r")}, r.event_seq, r.total_cost_cents,
       r.s_step_name, r.s_duration_ms
FROM r
"""


def _completion_kind() -> CheckpointKind:
    one_row = ", ".join(f"${n}::{t} AS {c}" for n, (c, t) in enumerate(_COMPLETION_INPUTS, 1))
    columns = ", ".join(f"{c} {t}" for c, t in _COMPLETION_INPUTS)
    return CheckpointKind(
        "completion",
        _COMPLETE.replace("{input}", f"SELECT {one_row}"),
        _COMPLETE.replace("{input}", f"SELECT * FROM jsonb_to_recordset($1::jsonb) AS i({columns})"),
        attrgetter("step_run_id", "output", "state_updates"),
        tuple(c for c, _ in _COMPLETION_INPUTS),
    )


# The group committer's third kind of row (after model calls and tool calls): a run's ending.
COMPLETION = _completion_kind()
_COMPLETE_SQL = COMPLETION.single_sql


@dataclass(frozen=True, slots=True)
class LastStep:
    """What a run's completion writes on its last step (the row's values besides run and events)."""

    step_run_id: str
    output: dict[str, Any]
    state_updates: dict[str, Any] | None


async def complete_last_step(
    db: asyncpg.Pool | asyncpg.Connection | GroupCommitter,
    run_id: str,
    step_run_id: str,
    owner: str,
    output: dict[str, Any],
    state_updates: dict[str, Any] | None,
) -> asyncpg.Record:
    """Complete the run's last step and the run in one statement; returns the final run row.

    Through a `GroupCommitter`, runs that end together share that statement and its commit (each
    row with its own guards). Raises InvalidStateTransition when the step is no longer RUNNING
    (as `runs.update_step` would, checked first), else LeaseLost when the run is not RUNNING under
    this lease."""
    event_ids = (new_id("evt"), new_id("evt"))  # STEP_COMPLETED, WORKFLOW_COMPLETED
    values = COMPLETION.row(
        run_id,
        owner,
        LastStep(step_run_id, output, state_updates or None),
        event_ids,
        new_id("whevt"),
        iso(utcnow()),
    )
    if not isinstance(db, GroupCommitter):
        row = await db.fetchrow(_COMPLETE_SQL, *values)
        if row is not None:
            return row
        return await _not_completed(db, run_id, step_run_id)
    try:
        found = await db.write(COMPLETION, run_id, values, "its completion")
    except FencedAfterUnknownOutcome:
        return await _not_completed(db.pool, run_id, step_run_id, ours_if=event_ids[1])
    except LeaseLost:
        return await _not_completed(db.pool, run_id, step_run_id)
    if found is ALREADY_RECORDED:
        return await _not_completed(db.pool, run_id, step_run_id, ours_if=event_ids[1])
    row_: asyncpg.Record = found
    return row_


async def _not_completed(
    db: asyncpg.Pool | asyncpg.Connection, run_id: str, step_run_id: str, *, ours_if: str | None = None
) -> asyncpg.Record:
    """The statement wrote nothing for this run: say which guard failed, in the order the separate
    writes checked them. `ours_if`: an earlier try of it had an unknown outcome (its connection
    was lost), and this is the id of the WORKFLOW_COMPLETED event that try wrote if it committed.
    The run is then ours, and completed, only if that event exists. A step and run found COMPLETED
    without it were completed by another worker, which took the run over while this one's retries
    ran past its lease and ran the same step again: LeaseLost, as for any lost lease."""
    status = await db.fetchval("SELECT status FROM step_runs WHERE id = $1", step_run_id)
    if ours_if is not None and status == StepStatus.COMPLETED:
        final = await db.fetchrow(_FINAL_RUN_SQL, run_id, ours_if)
        if final is not None:
            return final
        raise LeaseLost(f"run {run_id} was completed by another worker after its lease was lost")
    if status != StepStatus.RUNNING:
        raise InvalidStateTransition(
            f"Step run {step_run_id} is not in an allowed status (RUNNING)",
            details={"stepRunId": step_run_id, "expectedStatus": [StepStatus.RUNNING]},
        )
    raise LeaseLost(f"run {run_id} is no longer leased by this worker in status ['RUNNING']")


_FINAL_RUN_SQL = (
    f"SELECT id AS workflow_run_id, {RUN_COLUMNS}, event_seq, total_cost_cents FROM workflow_runs "
    "WHERE id = $1 AND status = 'COMPLETED' "
    # Events have no index on `id` alone: the run's part of the primary key bounds the search.
    "AND EXISTS (SELECT FROM workflow_events e WHERE e.workflow_run_id = $1 AND e.id = $2)"
)
