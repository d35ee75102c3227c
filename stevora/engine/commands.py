"""Commands from outside the worker: create, cancel, retry, pause, resume, decide an approval.

Each command is one transaction of guarded updates plus its events; it records *what happened*
(a signal arrived, a decision was made) and dispatches the run. The worker's driver then works
out what follows, so the flow logic lives in one place (driver.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import asyncpg
import structlog

from stevora.db import approvals, runs
from stevora.db.outbox import enqueue_webhooks
from stevora.db.runs import RELEASE
from stevora.engine import endings
from stevora.engine.hints import dispatch_hint
from stevora.engine.steps.approval import APPROVAL_SIGNAL
from stevora.errors import ConflictError, InvalidStateTransition, NotFoundError, ValidationError
from stevora.events import Event, EventType, WebhookEvent, step_completed, step_failed
from stevora.statuses import RunStatus, StepStatus

if TYPE_CHECKING:
    from stevora.runtime import Runtime

log = structlog.get_logger("stevora.engine")

Decision = Literal["approved", "rejected", "edited"]


async def _owned_run(conn: asyncpg.Connection, workspace_id: str, run_id: str) -> asyncpg.Record:
    row = await runs.get_run_in_workspace(conn, workspace_id, run_id)
    if row is None:
        raise NotFoundError("Workflow run not found", details={"workflowRunId": run_id})
    return row


async def create_run(
    rt: Runtime,
    workspace_id: str,
    definition_id: str,
    input: dict[str, Any] | None = None,
    idempotency_key: str | None = None,
) -> tuple[asyncpg.Record, bool]:
    """Insert a PENDING run and dispatch it. With an idempotency key already used in this
    workspace, return the existing run and `created=False` (race-safe: the unique index decides)."""
    async with rt.pool.acquire() as conn:
        # One round trip on the hot path: the definition check is the INSERT's SELECT.
        row = await runs.insert_run(
            conn,
            workspace_id=workspace_id,
            definition_id=definition_id,
            input=input or {},
            idempotency_key=idempotency_key,
        )
        if row is None:
            existing = None
            if idempotency_key is not None:
                existing = await runs.get_run_by_idempotency_key(conn, workspace_id, idempotency_key)
            if existing is None:
                raise NotFoundError("Workflow definition not found", details={"definitionId": definition_id})
            return existing, False
    log.info("run_created", workflow_run_id=row["id"], definition_id=definition_id)
    await dispatch_hint(rt.dispatcher, row["id"])
    return row, True


async def cancel_run(rt: Runtime, workspace_id: str, run_id: str) -> asyncpg.Record:
    async with rt.pool.acquire() as conn, conn.transaction():
        await _owned_run(conn, workspace_id, run_id)
        return await endings.cancel_run(conn, run_id)


async def retry_run(rt: Runtime, workspace_id: str, run_id: str) -> asyncpg.Record:
    """FAILED → RUNNING: the failed step runs again from scratch, with a fresh attempt budget."""
    async with rt.pool.acquire() as conn, conn.transaction():
        run = await _owned_run(conn, workspace_id, run_id)
        if run["status"] != RunStatus.FAILED:
            raise InvalidStateTransition(
                f"Only a FAILED run can be retried; this run is {run['status']}",
                details={"workflowRunId": run_id, "status": run["status"]},
            )
        failed = await runs.get_step_run(conn, run["current_step_run_id"])
        assert failed is not None
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
        row = await runs.update_run(
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
                **RELEASE,
            },
            now_columns=["dispatched_at"],
            events=[
                Event(
                    EventType.WORKFLOW_RESUMED,
                    {"reason": "retry", "stepName": failed["step_name"]},
                    new["id"],
                )
            ],
        )
    await dispatch_hint(rt.dispatcher, run_id)
    return row


async def pause_run(rt: Runtime, workspace_id: str, run_id: str) -> asyncpg.Record:
    """RUNNING → PAUSED. The worker stops at its next checkpoint (its fenced write fails)."""
    async with rt.pool.acquire() as conn, conn.transaction():
        await _owned_run(conn, workspace_id, run_id)
        row = await runs.update_run(
            conn,
            run_id,
            expect=[RunStatus.RUNNING],
            sets={"status": RunStatus.PAUSED},
            events=[Event(EventType.WORKFLOW_PAUSED, {"reason": "manual"})],
        )
    return row


async def resume_run(
    rt: Runtime, workspace_id: str, run_id: str, signal_type: str | None, payload: dict[str, Any] | None
) -> asyncpg.Record:
    """Deliver a signal to a run waiting in an `external_event` step (payload merged into state),
    or un-pause a PAUSED run (no signalType needed)."""
    async with rt.pool.acquire() as conn, conn.transaction():
        run = await _owned_run(conn, workspace_id, run_id)
        if run["status"] == RunStatus.PAUSED and signal_type is None:
            row = await runs.update_run(
                conn,
                run_id,
                expect=[RunStatus.PAUSED],
                sets={"status": RunStatus.RUNNING, **RELEASE},
                now_columns=["dispatched_at"],
                events=[Event(EventType.WORKFLOW_RESUMED, {"reason": "manual"})],
            )
        else:
            if signal_type is None:
                raise ValidationError.from_problems([{"path": "signalType", "message": "Field required"}])
            step_run = (
                await runs.get_step_run(conn, run["current_step_run_id"])
                if run["current_step_run_id"]
                else None
            )
            if (
                run["status"] != RunStatus.WAITING
                or step_run is None
                or step_run["status"] != StepStatus.WAITING
                or step_run["step_type"] != "external_event"
            ):
                raise InvalidStateTransition(
                    "Workflow run is not waiting for an external event",
                    details={"workflowRunId": run_id, "status": run["status"]},
                )
            if step_run["signal_type"] != signal_type:
                raise ConflictError(
                    f"Run is waiting for signal '{step_run['signal_type']}', not '{signal_type}'",
                    code="SIGNAL_MISMATCH",
                    details={"expectedSignalType": step_run["signal_type"], "signalType": signal_type},
                )
            done = await runs.update_step(
                conn,
                step_run["id"],
                expect=[StepStatus.WAITING],
                sets={
                    "status": StepStatus.COMPLETED,
                    "output": {"signalType": signal_type, "payload": payload or {}},
                },
                now_columns=["completed_at"],
            )
            row = await runs.update_run(
                conn,
                run_id,
                expect=[RunStatus.WAITING],
                sets={"status": RunStatus.RUNNING, "next_run_at": None, **RELEASE},
                merge_state=payload or None,
                now_columns=["dispatched_at"],
                events=[
                    step_completed(done),
                    Event(
                        EventType.WORKFLOW_RESUMED,
                        {
                            "reason": "signal",
                            "signalType": signal_type,
                            "payloadKeys": sorted((payload or {}).keys()),
                        },
                        step_run["id"],
                    ),
                ],
            )
    await dispatch_hint(rt.dispatcher, run_id)
    return row


async def decide_approval(
    rt: Runtime,
    workspace_id: str,
    approval_id: str,
    decision: Decision,
    edited_content: Any = None,
    decided_by: str | None = None,
) -> asyncpg.Record:
    """approved → step completes; edited → `editedContent` replaces state[contentKey] and the step
    completes; rejected → the step fails with APPROVAL_REJECTED (not retried) and so does the run."""
    if decision == "edited" and edited_content is None:
        raise ValidationError.from_problems(
            [{"path": "editedContent", "message": "editedContent is required when decision is 'edited'"}]
        )
    async with rt.pool.acquire() as conn, conn.transaction():
        approval = await approvals.decide(
            conn, workspace_id, approval_id, decision, edited_content, decided_by
        )
        if approval is None:
            current = await approvals.status_of(conn, workspace_id, approval_id)
            if current is None:
                raise NotFoundError("Approval request not found", details={"approvalRequestId": approval_id})
            raise InvalidStateTransition(
                f"Approval request is already {current.lower()}",
                details={"approvalRequestId": approval_id, "status": current},
            )
        step_run_id = approval["step_run_id"]
        decided = {
            "approvalRequestId": approval_id,
            "decision": decision,
            "decidedBy": decided_by,
            "stepName": approval["step_name"],
        }
        events = [Event(EventType.APPROVAL_DECIDED, decided, step_run_id)]
        if decision == "rejected":
            error = {
                "code": "APPROVAL_REJECTED",
                "retryable": False,
                "message": f"Approval rejected{' by ' + decided_by if decided_by else ''}",
            }
            rejected = await runs.update_step(
                conn,
                step_run_id,
                expect=[StepStatus.WAITING],
                sets={"status": StepStatus.FAILED, "error": error},
                now_columns=["completed_at"],
            )
            events.append(step_failed(rejected, error))
        else:
            done = await runs.update_step(
                conn,
                step_run_id,
                expect=[StepStatus.WAITING],
                sets={
                    "status": StepStatus.COMPLETED,
                    "output": {"decision": decision, "decidedBy": decided_by},
                },
                now_columns=["completed_at"],
            )
            events.append(step_completed(done))
        events.append(
            Event(
                EventType.WORKFLOW_RESUMED,
                {"reason": "approval", "signalType": APPROVAL_SIGNAL, "decision": decision},
                step_run_id,
            )
        )
        await runs.update_run(
            conn,
            approval["workflow_run_id"],
            expect=[RunStatus.WAITING],
            sets={"status": RunStatus.RUNNING, "next_run_at": None, **RELEASE},
            merge_state={approval["content_key"]: edited_content} if decision == "edited" else None,
            now_columns=["dispatched_at"],
            events=events,
        )
        await enqueue_webhooks(
            conn,
            workspace_id,
            WebhookEvent.APPROVAL_DECIDED,
            {**decided, "workflowRunId": approval["workflow_run_id"]},
        )
    await dispatch_hint(rt.dispatcher, approval["workflow_run_id"])
    return approval
