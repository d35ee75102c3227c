"""Commands from outside the worker on a run's lifecycle: create, cancel, retry, pause, resume.

Each command is one transaction of guarded updates plus its events; it records *what happened*
and dispatches the run. The worker's driver then works out what follows, so the flow logic lives
in one place (driver.py). Answers to a waiting step live with the kind that waits: a signal in
`steps/external_event.py` (delivered through `resume_run`), an approval decision in
`steps/approval.py`, tool outputs in `steps/awaited/client.py`, a child run's ending in
`steps/awaited/workflow.py`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import asyncpg
import structlog

from stevora.db import runs
from stevora.db.reads.rows import DbRow
from stevora.db.runs import RELEASE
from stevora.definitions import Budget
from stevora.definitions.flow import Concurrency
from stevora.engine import budget as budget_rules
from stevora.engine import endings, flow, limits
from stevora.engine.hints import dispatch_hint
from stevora.engine.steps import external_event
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
) -> tuple[DbRow, bool]:
    """Insert a PENDING run and dispatch it. With an idempotency key already used in this
    workspace, return the existing run and `created=False` (race-safe: the unique index decides).

    A definition with an `inputSchema` (or `defaultParams`) gets its defaults filled in and the
    input checked against it first: a bad input is a VALIDATION_ERROR naming the field, and
    nothing is written. So is a `budget` above the server's ceiling (`stevora.engine.budget`).
    """
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
    run_flow = flow.resolve(rt.settings, spec, input or {}, concurrency, priority)
    async with rt.pool.acquire() as conn:
        # One round trip on the hot path: the definition check is the INSERT's SELECT.
        with tracing.run_created(workspace_id, definition_id) as trace:
            row = await runs.insert_run(
                conn,
                workspace_id=workspace_id,
                definition_id=definition_id,
                input=input or {},
                idempotency_key=idempotency_key,
                trace_context=trace.carrier,
                budget=run_budget,
                flow=run_flow,
            )
            trace.created(row["id"] if row is not None else None)
        if row is None:
            existing = None
            if idempotency_key is not None:
                existing = await runs.get_run_by_idempotency_key(conn, workspace_id, idempotency_key)
            if existing is None:
                raise NotFoundError("Workflow definition not found", details={"definitionId": definition_id})
            return existing, False
    log.info("run_created", workflow_run_id=row["id"], definition_id=definition_id)
    RUNS_CREATED.inc()
    await dispatch_hint(rt.dispatcher, row["id"])
    return row, True


async def cancel_run(rt: Runtime, workspace_id: str, run_id: str) -> DbRow:
    wake: list[str] = []
    async with rt.pool.acquire() as conn, conn.transaction():
        await _owned_run(conn, workspace_id, run_id)
        row = await endings.cancel_run(conn, run_id, wake=wake)
    for other in wake:
        await dispatch_hint(rt.dispatcher, other)
    return row


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


async def pause_run(rt: Runtime, workspace_id: str, run_id: str) -> DbRow:
    """RUNNING → PAUSED. The worker stops at its next checkpoint (its fenced write fails)."""
    async with rt.pool.acquire() as conn, conn.transaction():
        await _owned_run(conn, workspace_id, run_id)
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
                raise ValidationError.from_problems([{"path": "signalType", "message": "Field required"}])
            row = await external_event.deliver_signal(conn, rt.settings, run, signal_type, payload)
    await dispatch_hint(rt.dispatcher, run_id)
    return row
