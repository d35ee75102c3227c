"""Commands from outside the worker on a run's lifecycle: create, cancel, retry, pause, resume.

Each command is one transaction of guarded updates plus its events; it records *what happened*
and dispatches the run. The worker's driver then works out what follows, so the flow logic lives
in one place (driver.py). Answers to a waiting step live with the kind that waits: a signal in
`steps/external_event.py` (delivered through `resume_run`), an approval decision in
`steps/approval.py`, tool outputs in `steps/awaited/client.py`, a child run's ending in
`steps/awaited/workflow.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import asyncpg
import structlog

from stevora.db import forks as db_forks
from stevora.db import runs
from stevora.db.reads.rows import DbRow
from stevora.db.runs import RELEASE
from stevora.definitions import Budget
from stevora.definitions.flow import Concurrency
from stevora.engine import budget as budget_rules
from stevora.engine import endings, flow, limits
from stevora.engine.hints import dispatch_hint
from stevora.engine.idempotency import NEW_RUN, check_same_kind
from stevora.engine.steps import external_event
from stevora.engine.steps.llm_attachments import check_input_attachments
from stevora.errors import InvalidStateTransition, NotFoundError, ValidationError
from stevora.events import Event, EventType
from stevora.observability import tracing
from stevora.observability.metrics import RUNS_CREATED
from stevora.statuses import PauseReason, ResumeReason, RunStatus
from stevora.tools import field_problem, schema_problems, with_defaults

if TYPE_CHECKING:
    from stevora.runtime import Runtime

log = structlog.get_logger("stevora.engine")


async def _owned_run(conn: asyncpg.Connection, workspace_id: str, run_id: str) -> DbRow:
    row: DbRow | None = await runs.get_run_in_workspace(conn, workspace_id, run_id)
    if row is None:
        raise NotFoundError("Workflow run not found", details={"workflowRunId": run_id})
    return row


async def create_run(
    rt: Runtime,
    workspace_id: str,
    definition_id: str,
    input: dict[str, Any] | None = None,
    idempotency_key: str | None = None,
    budget: Budget | None = None,
    concurrency: Concurrency | None = None,
    priority: int | None = None,
    conn: asyncpg.Connection | None = None,
) -> tuple[DbRow, bool]:
    """Insert a PENDING run and dispatch it. With an idempotency key already used in this
    workspace, return the existing run and `created=False` (race-safe: the unique index decides).

    A definition with an `inputSchema` (or `defaultParams`) gets its defaults filled in and the
    input checked against it first: a bad input is a VALIDATION_ERROR naming the field, and
    nothing is written. So is a `budget` above the server's ceiling (`stevora.engine.budget`).
    Given `conn`, the run is inserted in the caller's transaction and not dispatched: the caller
    dispatches after its commit (a trigger's run and the row that records it commit together).
    """
    insert = await prepare_run(
        rt, workspace_id, definition_id, input, idempotency_key, budget, concurrency, priority
    )
    if conn is not None:
        return await insert.on(conn)
    async with rt.pool.acquire() as own:
        row, created = await insert.on(own)
    if created:
        await dispatch_hint(rt.dispatcher, row["id"])
    return row, created


async def prepare_run(
    rt: Runtime,
    workspace_id: str,
    definition_id: str,
    input: dict[str, Any] | None = None,
    idempotency_key: str | None = None,
    budget: Budget | None = None,
    concurrency: Concurrency | None = None,
    priority: int | None = None,
) -> NewRun:
    """A run checked and ready to insert (no I/O but the definition cache): its input with the
    schema's defaults, its budget and flow control. A bad input is a VALIDATION_ERROR naming the field."""
    limits.check_run_input(rt.settings, input or {})
    spec = await rt.definitions.get_in_workspace(workspace_id, definition_id)
    run_budget = budget_rules.resolve(rt.settings, spec.budget if spec is not None else None, budget)
    schema = spec.input_json_schema() if spec is not None else None
    if schema is not None:
        input = with_defaults(schema, input or {})
        problems = schema_problems(schema, input)
        if problems:
            raise ValidationError.from_problems(
                [field_problem(problem) for problem in problems],
                message="Invalid run input: " + "; ".join(problems),
            )
    if spec is not None:
        check_input_attachments(spec, input or {}, rt.settings)
    run_flow = flow.resolve(rt.settings, spec, input or {}, concurrency, priority)
    return NewRun(workspace_id, definition_id, input or {}, idempotency_key, run_budget, run_flow)


async def insert_runs(
    conn: asyncpg.Connection, news: list[NewRun]
) -> dict[tuple[str, str], tuple[str, bool]]:
    """Insert many keyed runs in two statements at most (the caller's transaction; it dispatches
    after commit): {(workspace, idempotency key): (run id, created)}. A key already used keeps its
    run; a run whose definition is gone is left out."""
    keyed: list[runs.KeyedRun] = []
    for new in news:
        assert new.idempotency_key is not None, "insert_runs is for keyed runs"
        with tracing.run_created(new.workspace_id, new.definition_id) as trace:
            keyed.append(
                runs.KeyedRun(new.workspace_id, new.definition_id, new.input, new.idempotency_key,
                              trace.carrier, new.budget, new.flow)
            )  # fmt: skip
    made = await runs.insert_keyed_runs(conn, keyed)
    found = {key: (run_id, True) for key, run_id in made.items()}
    taken = [
        (n.workspace_id, n.idempotency_key) for n in keyed if (n.workspace_id, n.idempotency_key) not in made
    ]
    if taken:
        existing = await runs.run_ids_by_key(conn, taken)
        found |= {key: (run_id, False) for key, run_id in existing.items()}
    if made:
        log.info("runs_created", count=len(made), workflow_run_ids=sorted(made.values()))
        RUNS_CREATED.inc(len(made))
    return found


@dataclass(frozen=True, slots=True)
class NewRun:
    workspace_id: str
    definition_id: str
    input: dict[str, Any]
    idempotency_key: str | None
    budget: dict[str, Any] | None
    flow: runs.FlowColumns

    async def on(self, conn: asyncpg.Connection) -> tuple[DbRow, bool]:
        # One round trip on the hot path: the definition check is the INSERT's SELECT.
        with tracing.run_created(self.workspace_id, self.definition_id) as trace:
            row = await runs.insert_run(
                conn,
                workspace_id=self.workspace_id,
                definition_id=self.definition_id,
                input=self.input,
                idempotency_key=self.idempotency_key,
                trace_context=trace.carrier,
                budget=self.budget,
                flow=self.flow,
            )
            trace.created(row["id"] if row is not None else None)
        if row is None:
            existing = None
            if self.idempotency_key is not None:
                existing = await runs.get_run_by_idempotency_key(
                    conn, self.workspace_id, self.idempotency_key
                )
            if existing is None:
                raise NotFoundError(
                    "Workflow definition not found", details={"definitionId": self.definition_id}
                )
            made = await db_forks.get_by_key(conn, self.workspace_id, self.idempotency_key or "")
            if made is not None:
                check_same_kind(made, NEW_RUN, self.idempotency_key or "")
            return existing, False
        log.info("run_created", workflow_run_id=row["id"], definition_id=self.definition_id)
        RUNS_CREATED.inc()
        return row, True


async def cancel_run(rt: Runtime, workspace_id: str, run_id: str) -> DbRow:
    async with rt.pool.acquire() as conn, conn.transaction():
        await _owned_run(conn, workspace_id, run_id)
        ended = await endings.cancel_run(conn, run_id)
    await endings.after_commit(rt, ended)
    return ended.run


async def retry_run(rt: Runtime, workspace_id: str, run_id: str) -> DbRow:
    """FAILED → RUNNING: the failed step runs again from scratch, with a fresh attempt budget."""
    async with rt.pool.acquire() as conn, conn.transaction():
        run = await _owned_run(conn, workspace_id, run_id)
        if run["status"] != RunStatus.FAILED:
            raise InvalidStateTransition(
                f"Only a FAILED run can be retried; this run is {run['status']}",
                details={"workflowRunId": run_id, "status": run["status"]},
            )
        await flow.take_slot_for_retry(conn, run)
        failed = (
            await runs.get_step_run(conn, run["current_step_run_id"]) if run["current_step_run_id"] else None
        )
        if failed is None:  # a FAILED run with no step run: nothing to run again
            raise InvalidStateTransition(
                "This run failed before any step ran; start a new run instead",
                details={"workflowRunId": run_id, "status": run["status"]},
            )
        visit = await runs.next_visit(conn, run_id, failed["step_name"])
        new = await runs.insert_step_run(
            conn,
            run_id=run_id,
            step_name=failed["step_name"],
            step_type=failed["step_type"],
            step_index=failed["step_index"],
            visit=visit,
            attempt=1,
        )
        row: DbRow = await runs.update_run(
            conn,
            run_id,
            expect=[RunStatus.FAILED],
            sets={
                "status": RunStatus.RUNNING,
                "error": None,
                "failed_at": None,
                "current_step_run_id": new["id"],
                "current_step_name": failed["step_name"],
                "next_run_at": None,
                "crash_count": 0,
                **RELEASE,
            },
            now_columns=["dispatched_at"],
            events=[
                Event(
                    EventType.WORKFLOW_RESUMED,
                    {"reason": ResumeReason.RETRY, "stepName": failed["step_name"]},
                    new["id"],
                )
            ],
        )
    await dispatch_hint(rt.dispatcher, run_id)
    return row


# What to do instead, after "this run is <status>" (a wrong command should name the right one).
_PAUSE_HINTS = {
    RunStatus.WAITING: " (waiting: it uses no worker until what it waits for arrives; cancel it to stop it)",
    RunStatus.PENDING: " (it has not started yet; cancel it to stop it)",
    RunStatus.PAUSED: " already",
}
_ENDED = " and has ended: nothing to resume (a FAILED run can be retried; `runs replay` starts it again)"
_RESUME_HINTS = {
    RunStatus.WAITING: " (a run WAITING in an external_event step takes its signalType)",
    RunStatus.COMPLETED: _ENDED,
    RunStatus.FAILED: _ENDED,
    RunStatus.CANCELLED: _ENDED,
}


async def pause_run(rt: Runtime, workspace_id: str, run_id: str) -> DbRow:
    """RUNNING → PAUSED. The worker stops at its next checkpoint (its fenced write fails)."""
    async with rt.pool.acquire() as conn, conn.transaction():
        run = await _owned_run(conn, workspace_id, run_id)
        if run["status"] != RunStatus.RUNNING:
            raise InvalidStateTransition(
                f"Only a RUNNING run can be paused; this run is {run['status']}"
                + _PAUSE_HINTS.get(run["status"], ""),
                details={"workflowRunId": run_id, "status": run["status"]},
            )
        row: DbRow = await runs.update_run(
            conn,
            run_id,
            expect=[RunStatus.RUNNING],
            sets={"status": RunStatus.PAUSED},
            events=[Event(EventType.WORKFLOW_PAUSED, {"reason": PauseReason.MANUAL})],
        )
    return row


async def resume_run(
    rt: Runtime, workspace_id: str, run_id: str, signal_type: str | None, payload: dict[str, Any] | None
) -> DbRow:
    """Deliver a signal to a run waiting in an `external_event` step (payload merged into state),
    or un-pause a PAUSED run (no signalType needed)."""
    if payload:
        limits.check_sized(
            rt.settings,
            payload,
            "payload",
            rt.settings.max_signal_payload_bytes,
            "STEVORA_MAX_SIGNAL_PAYLOAD_BYTES",
        )
    async with rt.pool.acquire() as conn, conn.transaction():
        run = await _owned_run(conn, workspace_id, run_id)
        if run["status"] == RunStatus.PAUSED and signal_type is None:
            row: DbRow = await runs.update_run(
                conn,
                run_id,
                expect=[RunStatus.PAUSED],
                sets={"status": RunStatus.RUNNING, **RELEASE},
                now_columns=["dispatched_at"],
                events=[Event(EventType.WORKFLOW_RESUMED, {"reason": ResumeReason.MANUAL})],
            )
        else:
            if signal_type is None:
                details: dict[str, Any] = {"workflowRunId": run_id, "status": run["status"]}
                if run["status"] == RunStatus.WAITING:  # the field that would have fitted
                    details["errors"] = [{"path": "signalType", "message": "Field required"}]
                raise InvalidStateTransition(
                    f"This run is {run['status']}: only a PAUSED run resumes without a signal"
                    + _RESUME_HINTS.get(run["status"], ""),
                    details=details,
                )
            row = await external_event.deliver_signal(conn, rt.settings, run, signal_type, payload)
    await dispatch_hint(rt.dispatcher, run_id)
    return row
