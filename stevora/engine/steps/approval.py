"""A person's decision: the `approval` step and approval-gated tool calls.

* `approval` step: asks a person to approve, edit or reject `state[contentKey]`. Going WAITING
  writes the approval request (and its `approval.requested` webhook) in the driver's
  transaction; a due wait expires the request and fails the step with TIMEOUT.
* Approval-gated tool calls (`requiresApproval`, an awaited kind): handed over, each call gets an
  approval request whose content is `{tool, arguments, toolCallId}`; it has no deadline.
* Answered by `decide_approval` (API, UI), one transaction: approved → the step completes (or
  the call runs); edited → `editedContent` replaces state[contentKey] (or the call's arguments);
  rejected → the step fails with APPROVAL_REJECTED (or the model gets an error result).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

import asyncpg

from stevora.clock import iso, utcnow
from stevora.db import approvals, runs
from stevora.db import awaited as db_awaited
from stevora.db.awaited import NewAwaitedCall
from stevora.db.outbox import enqueue_webhooks
from stevora.db.reads.rows import DbRow
from stevora.db.runs import RELEASE
from stevora.definitions import ApprovalStep, LlmToolDef
from stevora.engine import limits
from stevora.engine.hints import dispatch_hint
from stevora.engine.steps.awaited import Answer, answer
from stevora.engine.steps.awaited.kind import CallKind, HandingOver, ToolEntry
from stevora.engine.steps.base import StepExecution, StepType, WaitContext, WaitPlan
from stevora.errors import InvalidStateTransition, NotFoundError, ValidationError
from stevora.events import Event, EventType, WebhookEvent, step_completed, step_failed
from stevora.statuses import (
    AnsweredBy,
    ApprovalDecision,
    AwaitedKind,
    AwaitedStatus,
    PauseReason,
    ResumeReason,
    RunStatus,
    StepStatus,
)
from stevora.tasks import StepResult
from stevora.tools import RegisteredTool, ToolOutcome, field_problem, schema_problems

if TYPE_CHECKING:
    from stevora.runtime import Runtime

APPROVAL_SIGNAL = "approval_decision"

# As the API and the UI pass it (the values of ApprovalDecision).
Decision = Literal["approved", "rejected", "edited"]


class ApprovalStepType(StepType):
    name = "approval"
    waits_for = "approval decision"

    async def execute(self, rt: Runtime, ex: StepExecution, step: ApprovalStep) -> StepResult:
        if step.content_key not in ex.state:
            return StepResult(
                status="failed",
                error={
                    "code": "APPROVAL_CONTENT_MISSING",
                    "message": f"State has no key '{step.content_key}' to send for approval",
                },
                retryable=False,
            )
        until = utcnow() + timedelta(milliseconds=step.timeout_ms) if step.timeout_ms else None
        return StepResult(
            status="waiting", signal_type=APPROVAL_SIGNAL, wait_until=until, pause_reason=PauseReason.APPROVAL
        )

    async def on_waiting(self, wait: WaitContext, result: StepResult) -> WaitPlan:
        step: ApprovalStep = wait.step
        content = (wait.run["state"] or {}).get(step.content_key)
        approval_id = await open_request(
            wait,
            content_key=step.content_key,
            content=content,
            prompt=step.prompt,
            expires_at=result.wait_until,
        )
        payload = {"approvalRequestId": approval_id, "stepName": step.name, "contentKey": step.content_key}
        requested = Event(
            EventType.APPROVAL_REQUESTED,
            {**payload, "expiresAt": iso(result.wait_until)},
            wait.step_run["id"],
        )
        return WaitPlan(events=(requested,))

    async def on_due(self, wait: WaitContext) -> StepResult | None:
        await approvals.expire_for_step(wait.conn, wait.step_run["id"])
        return await super().on_due(wait)


async def open_request(
    wait: WaitContext,
    *,
    content_key: str,
    content: Any,
    prompt: str | None,
    expires_at: datetime | None,
    awaited_tool_call_id: str | None = None,
) -> str:
    """An approval request for the waiting step and its `approval.requested` webhook, in the wait's
    transaction (an `approval` step's, or an approval-gated tool call's); returns its id."""
    run = wait.run
    approval_id = await approvals.insert(
        wait.conn,
        workspace_id=run["workspace_id"],
        run_id=run["id"],
        step_run_id=wait.step_run["id"],
        step_name=wait.step_run["step_name"],
        content_key=content_key,
        content=content,
        prompt=prompt,
        expires_at=expires_at,
        awaited_tool_call_id=awaited_tool_call_id,
    )
    await enqueue_webhooks(
        wait.conn,
        run["workspace_id"],
        WebhookEvent.APPROVAL_REQUESTED,
        {
            "approvalRequestId": approval_id,
            "workflowRunId": run["id"],
            "stepName": wait.step_run["step_name"],
            "contentKey": content_key,
            "content": content,
            "prompt": prompt,
        },
    )
    return approval_id


TOOL_CALL_CONTENT_KEY = "toolCall"


async def request_tool_approval(wait: WaitContext, call: NewAwaitedCall) -> Event:
    """The approval request for an approval-gated call (content `{tool, arguments, toolCallId}`),
    its `approval.requested` webhook, and the APPROVAL_REQUESTED event to write with the wait."""
    approval_id = await open_request(
        wait,
        content_key=TOOL_CALL_CONTENT_KEY,
        content={"tool": call.tool_name, "arguments": call.arguments, "toolCallId": call.tool_call_id},
        prompt=f"The model wants to call the tool '{call.tool_name}'. Approve, edit the arguments, or reject.",
        expires_at=None,
        awaited_tool_call_id=call.id,
    )
    return Event(
        EventType.APPROVAL_REQUESTED,
        {
            "approvalRequestId": approval_id,
            "stepName": wait.step_run["step_name"],
            "contentKey": TOOL_CALL_CONTENT_KEY,
            "toolName": call.tool_name,
            "toolCallId": call.tool_call_id,
        },
        wait.step_run["id"],
    )


class ApprovalKind(CallKind):
    """Approval-gated handler calls (`requiresApproval`): a person decides, then the resumed step
    runs the call (or the model is told it was declined)."""

    kind = AwaitedKind.APPROVAL
    pause_reason = PauseReason.TOOL_APPROVAL
    pause_rank = 1
    details_key = "approvalCalls"

    def gates(self, tool: ToolEntry, registered: RegisteredTool | None) -> bool:
        return (registered is not None and registered.requires_approval) or (
            isinstance(tool, LlmToolDef) and tool.requires_approval
        )

    async def prepare(self, handing: HandingOver) -> NewAwaitedCall | ToolOutcome:
        # With the schema an edit of the arguments is checked against.
        return replace(handing.call, parameters=handing.schema)

    async def on_handed_over(
        self, wait: WaitContext, calls: list[NewAwaitedCall], inserted: set[str]
    ) -> WaitPlan:
        """An approval request for each approval-gated call recorded just now."""
        return WaitPlan(
            events=tuple([await request_tool_approval(wait, c) for c in calls if c.id in inserted])
        )


TOOL_CALL_KIND = ApprovalKind()


async def decide_approval(
    rt: Runtime,
    workspace_id: str,
    approval_id: str,
    decision: Decision,
    edited_content: Any = None,
    decided_by: str | None = None,
) -> DbRow:
    """approved → step completes; edited → `editedContent` replaces state[contentKey] and the step
    completes; rejected → the step fails with APPROVAL_REJECTED (not retried) and so does the run.

    For an approval-gated tool call: approved → the call runs; edited → it runs with `editedContent`
    as its arguments (checked against the tool's schema now: a bad edit is a VALIDATION_ERROR and
    nothing is recorded); rejected → the model gets an error result saying a person declined it.
    """
    decided = ApprovalDecision(decision)
    if decided == ApprovalDecision.EDITED and edited_content is None:
        raise ValidationError.from_problems(
            [{"path": "editedContent", "message": "editedContent is required when decision is 'edited'"}]
        )
    if edited_content is not None:
        limits.check_value(rt.settings, edited_content, "editedContent")
    async with rt.pool.acquire() as conn, conn.transaction():
        approval: DbRow | None = await approvals.decide(
            conn, workspace_id, approval_id, decided, edited_content, decided_by
        )
        if approval is None:
            current = await approvals.status_of(conn, workspace_id, approval_id)
            if current is None:
                raise NotFoundError("Approval request not found", details={"approvalRequestId": approval_id})
            raise InvalidStateTransition(
                f"Approval request is already {current.lower()}",
                details={"approvalRequestId": approval_id, "status": current},
            )
        if approval["awaited_tool_call_id"] is not None:
            resumed = await _decide_tool_call(
                conn, workspace_id, approval, decided, edited_content, decided_by
            )
        else:
            if decided == ApprovalDecision.EDITED:
                run = await runs.get_run(conn, approval["workflow_run_id"])
                limits.check_state_merge(
                    rt.settings, run["state"] if run else None, {approval["content_key"]: edited_content}
                )
            await _decide_step(conn, workspace_id, approval, decided, edited_content, decided_by)
            resumed = True
    # Dispatch only after commit: a claim that runs earlier still sees the run WAITING.
    if resumed:
        await dispatch_hint(rt.dispatcher, approval["workflow_run_id"])
    return approval


async def _decide_step(
    conn: asyncpg.Connection,
    workspace_id: str,
    approval: DbRow,
    decision: ApprovalDecision,
    edited_content: Any,
    decided_by: str | None,
) -> None:
    """The decision on an `approval` step, in the decision's transaction."""
    approval_id = approval["id"]
    step_run_id = approval["step_run_id"]
    decided = {
        "approvalRequestId": approval_id,
        "decision": decision,
        "decidedBy": decided_by,
        "stepName": approval["step_name"],
    }
    events = [Event(EventType.APPROVAL_DECIDED, decided, step_run_id)]
    if decision == ApprovalDecision.REJECTED:
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
            {"reason": ResumeReason.APPROVAL, "signalType": APPROVAL_SIGNAL, "decision": decision},
            step_run_id,
        )
    )
    await runs.update_run(
        conn,
        approval["workflow_run_id"],
        expect=[RunStatus.WAITING],
        sets={"status": RunStatus.RUNNING, "next_run_at": None, **RELEASE},
        merge_state={approval["content_key"]: edited_content}
        if decision == ApprovalDecision.EDITED
        else None,
        now_columns=["dispatched_at"],
        events=events,
    )
    await enqueue_webhooks(
        conn,
        workspace_id,
        WebhookEvent.APPROVAL_DECIDED,
        {**decided, "workflowRunId": approval["workflow_run_id"]},
    )


async def _decide_tool_call(
    conn: asyncpg.Connection,
    workspace_id: str,
    approval: DbRow,
    decision: ApprovalDecision,
    edited_content: Any,
    decided_by: str | None,
) -> bool:
    """The decision on an approval-gated tool call, in the decision's transaction; True when the
    run resumed (the caller dispatches it after commit)."""
    call = await db_awaited.get(conn, approval["awaited_tool_call_id"])
    run = await runs.lock_run(conn, approval["workflow_run_id"])
    if (
        call is None
        or run is None
        or run["status"] != RunStatus.WAITING
        or call["status"] != AwaitedStatus.PENDING
    ):
        raise InvalidStateTransition(
            "The tool call of this approval request is no longer waiting for a decision",
            details={"approvalRequestId": approval["id"]},
        )
    decided = {
        "approvalRequestId": approval["id"],
        "decision": decision,
        "decidedBy": decided_by,
        "stepName": approval["step_name"],
        "toolName": call["tool_name"],
        "toolCallId": call["tool_call_id"],
    }
    before = [Event(EventType.APPROVAL_DECIDED, decided, approval["step_run_id"])]
    if decision == ApprovalDecision.REJECTED:
        by = f" ({decided_by})" if decided_by else ""
        declined = Answer(
            call,
            ok=False,
            error=f"A person declined this call to '{call['tool_name']}'{by}",
            error_code="APPROVAL_REJECTED",
            answered_by=AnsweredBy.PERSON,
        )
        resumed = await answer(conn, run, [declined], reason=ResumeReason.APPROVAL, events_before=before)
    else:
        arguments = call["arguments"] if decision == ApprovalDecision.APPROVED else edited_content
        if decision == ApprovalDecision.EDITED:
            _check_edited_arguments(call, edited_content)
        resumed = await answer(
            conn,
            run,
            [],
            reason=ResumeReason.APPROVAL,
            approved={call["id"]: arguments},
            events_before=before,
        )
    await enqueue_webhooks(
        conn, workspace_id, WebhookEvent.APPROVAL_DECIDED, {**decided, "workflowRunId": run["id"]}
    )
    return resumed


def _check_edited_arguments(call: DbRow, edited: Any) -> None:
    if not isinstance(edited, dict):
        raise ValidationError.from_problems(
            [{"path": "editedContent", "message": "Edited tool arguments must be a JSON object"}]
        )
    if call["parameters"] is not None:
        problems = schema_problems(call["parameters"], edited)
        if problems:
            raise ValidationError.from_problems(
                [field_problem(problem, "editedContent") for problem in problems]
            )
