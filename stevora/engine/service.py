"""Commands from outside the worker: create, cancel, retry, pause, resume, decide an approval.

Each command is one transaction of guarded updates plus its events; it records *what happened*
(a signal arrived, a decision was made) and dispatches the run. The worker's driver then works
out what follows, so the flow logic lives in one place (runner.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import asyncpg
import structlog

from stevora.engine import store
from stevora.engine.executors import APPROVAL_SIGNAL
from stevora.engine.store import Event
from stevora.errors import ConflictError, InvalidStateTransition, NotFoundError, ValidationError
from stevora.ids import new_id

if TYPE_CHECKING:
    from stevora.runtime import Runtime

log = structlog.get_logger("stevora.engine")

Decision = Literal["approved", "rejected", "edited"]
ACTIVE = ["PENDING", "RUNNING", "WAITING", "PAUSED"]
_RELEASE = {"lease_owner": None, "lease_expires_at": None}


async def _owned_run(conn: asyncpg.Connection, workspace_id: str, run_id: str) -> asyncpg.Record:
    row = await conn.fetchrow(
        f"SELECT {store.RUN_COLUMNS} FROM workflow_runs WHERE id = $1 AND workspace_id = $2",
        run_id,
        workspace_id,
    )
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
        row = await conn.fetchrow(
            "INSERT INTO workflow_runs (id, workspace_id, definition_id, status, input, idempotency_key, dispatched_at) "
            "SELECT $1, $2::text, d.id, 'PENDING', $4, $5, now() FROM workflow_definitions d "
            "WHERE d.id = $3 AND d.workspace_id = $2 "
            "ON CONFLICT (workspace_id, idempotency_key) DO NOTHING "
            f"RETURNING {store.RUN_COLUMNS}",
            new_id("wfrun"),
            workspace_id,
            definition_id,
            input or {},
            idempotency_key,
        )
        if row is None:
            existing = None
            if idempotency_key is not None:
                existing = await conn.fetchrow(
                    f"SELECT {store.RUN_COLUMNS} FROM workflow_runs WHERE workspace_id = $1 AND idempotency_key = $2",
                    workspace_id,
                    idempotency_key,
                )
            if existing is None:
                raise NotFoundError("Workflow definition not found", details={"definitionId": definition_id})
            return existing, False
    log.info("run_created", workflow_run_id=row["id"], definition_id=definition_id)
    await rt.dispatcher.dispatch(row["id"])
    return row, True


async def cancel_run(rt: Runtime, workspace_id: str, run_id: str) -> asyncpg.Record:
    async with rt.pool.acquire() as conn, conn.transaction():
        await _owned_run(conn, workspace_id, run_id)
        steps = await conn.fetch(
            "UPDATE step_runs SET status = 'CANCELLED', updated_at = now(), completed_at = now() "
            "WHERE workflow_run_id = $1 AND status IN ('PENDING', 'RUNNING', 'WAITING') RETURNING id",
            run_id,
        )
        await conn.execute(
            "UPDATE approval_requests SET status = 'CANCELLED', updated_at = now() "
            "WHERE workflow_run_id = $1 AND status = 'PENDING'",
            run_id,
        )
        row = await store.update_run(
            conn,
            run_id,
            expect=ACTIVE,
            sets={"status": "CANCELLED", "next_run_at": None, **_RELEASE},
            now_columns=["cancelled_at"],
            events=[Event("WORKFLOW_CANCELLED", {"cancelledStepRuns": [s["id"] for s in steps]})],
        )
        await store.enqueue_webhooks(
            conn, workspace_id, "workflow.cancelled", {"workflowRunId": run_id, "status": "CANCELLED"}
        )
    log.info("run_cancelled", workflow_run_id=run_id)
    return row


async def retry_run(rt: Runtime, workspace_id: str, run_id: str) -> asyncpg.Record:
    """FAILED → RUNNING: the failed step runs again from scratch, with a fresh attempt budget."""
    async with rt.pool.acquire() as conn, conn.transaction():
        run = await _owned_run(conn, workspace_id, run_id)
        if run["status"] != "FAILED":
            raise InvalidStateTransition(
                f"Only a FAILED run can be retried; this run is {run['status']}",
                details={"workflowRunId": run_id, "status": run["status"]},
            )
        failed = await store.get_step_run(conn, run["current_step_run_id"])
        assert failed is not None
        visit = await store.next_visit(conn, run_id, failed["step_name"])
        new = await store.insert_step_run(
            conn,
            run_id=run_id,
            step_name=failed["step_name"],
            step_type=failed["step_type"],
            step_index=failed["step_index"],
            visit=visit,
            attempt=1,
        )
        row = await store.update_run(
            conn,
            run_id,
            expect=["FAILED"],
            sets={
                "status": "RUNNING",
                "error": None,
                "failed_at": None,
                "current_step_run_id": new["id"],
                "current_step_name": failed["step_name"],
                "next_run_at": None,
                **_RELEASE,
            },
            now_columns=["dispatched_at"],
            events=[
                Event("WORKFLOW_RESUMED", {"reason": "retry", "stepName": failed["step_name"]}, new["id"])
            ],
        )
    await rt.dispatcher.dispatch(run_id)
    return row


async def pause_run(rt: Runtime, workspace_id: str, run_id: str) -> asyncpg.Record:
    """RUNNING → PAUSED. The worker stops at its next checkpoint (its fenced write fails)."""
    async with rt.pool.acquire() as conn, conn.transaction():
        await _owned_run(conn, workspace_id, run_id)
        row = await store.update_run(
            conn,
            run_id,
            expect=["RUNNING"],
            sets={"status": "PAUSED"},
            events=[Event("WORKFLOW_PAUSED", {"reason": "manual"})],
        )
    return row


async def resume_run(
    rt: Runtime, workspace_id: str, run_id: str, signal_type: str | None, payload: dict[str, Any] | None
) -> asyncpg.Record:
    """Deliver a signal to a run waiting in an `external_event` step (payload merged into state),
    or un-pause a PAUSED run (no signalType needed)."""
    async with rt.pool.acquire() as conn, conn.transaction():
        run = await _owned_run(conn, workspace_id, run_id)
        if run["status"] == "PAUSED" and signal_type is None:
            row = await store.update_run(
                conn,
                run_id,
                expect=["PAUSED"],
                sets={"status": "RUNNING", **_RELEASE},
                now_columns=["dispatched_at"],
                events=[Event("WORKFLOW_RESUMED", {"reason": "manual"})],
            )
        else:
            if signal_type is None:
                raise ValidationError.from_problems([{"path": "signalType", "message": "Field required"}])
            step_run = (
                await store.get_step_run(conn, run["current_step_run_id"])
                if run["current_step_run_id"]
                else None
            )
            if (
                run["status"] != "WAITING"
                or step_run is None
                or step_run["status"] != "WAITING"
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
            done = await store.update_step(
                conn,
                step_run["id"],
                expect=["WAITING"],
                sets={"status": "COMPLETED", "output": {"signalType": signal_type, "payload": payload or {}}},
                now_columns=["completed_at"],
            )
            row = await store.update_run(
                conn,
                run_id,
                expect=["WAITING"],
                sets={"status": "RUNNING", "next_run_at": None, **_RELEASE},
                merge_state=payload or None,
                now_columns=["dispatched_at"],
                events=[
                    store.step_completed_event(done),
                    Event(
                        "WORKFLOW_RESUMED",
                        {
                            "reason": "signal",
                            "signalType": signal_type,
                            "payloadKeys": sorted((payload or {}).keys()),
                        },
                        step_run["id"],
                    ),
                ],
            )
    await rt.dispatcher.dispatch(run_id)
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
        approval = await conn.fetchrow(
            "UPDATE approval_requests SET status = 'DECIDED', decision = $3, edited_content = $4, decided_by = $5, "
            "decided_at = now(), updated_at = now() WHERE id = $1 AND workspace_id = $2 AND status = 'PENDING' "
            "RETURNING *",
            approval_id,
            workspace_id,
            decision,
            edited_content,
            decided_by,
        )
        if approval is None:
            current = await conn.fetchrow(
                "SELECT status FROM approval_requests WHERE id = $1 AND workspace_id = $2",
                approval_id,
                workspace_id,
            )
            if current is None:
                raise NotFoundError("Approval request not found", details={"approvalRequestId": approval_id})
            raise InvalidStateTransition(
                f"Approval request is already {current['status'].lower()}",
                details={"approvalRequestId": approval_id, "status": current["status"]},
            )
        step_run_id = approval["step_run_id"]
        decided = {
            "approvalRequestId": approval_id,
            "decision": decision,
            "decidedBy": decided_by,
            "stepName": approval["step_name"],
        }
        events = [Event("APPROVAL_DECIDED", decided, step_run_id)]
        if decision == "rejected":
            error = {
                "code": "APPROVAL_REJECTED",
                "retryable": False,
                "message": f"Approval rejected{' by ' + decided_by if decided_by else ''}",
            }
            await store.update_step(
                conn,
                step_run_id,
                expect=["WAITING"],
                sets={"status": "FAILED", "error": error},
                now_columns=["completed_at"],
            )
            events.append(
                Event(
                    "STEP_FAILED",
                    {"stepName": approval["step_name"], "attempt": 1, "error": error},
                    step_run_id,
                )
            )
        else:
            done = await store.update_step(
                conn,
                step_run_id,
                expect=["WAITING"],
                sets={"status": "COMPLETED", "output": {"decision": decision, "decidedBy": decided_by}},
                now_columns=["completed_at"],
            )
            events.append(store.step_completed_event(done))
        events.append(
            Event(
                "WORKFLOW_RESUMED",
                {"reason": "approval", "signalType": APPROVAL_SIGNAL, "decision": decision},
                step_run_id,
            )
        )
        await store.update_run(
            conn,
            approval["workflow_run_id"],
            expect=["WAITING"],
            sets={"status": "RUNNING", "next_run_at": None, **_RELEASE},
            merge_state={approval["content_key"]: edited_content} if decision == "edited" else None,
            now_columns=["dispatched_at"],
            events=events,
        )
        await store.enqueue_webhooks(
            conn, workspace_id, "approval.decided", {**decided, "workflowRunId": approval["workflow_run_id"]}
        )
    await rt.dispatcher.dispatch(approval["workflow_run_id"])
    return approval
