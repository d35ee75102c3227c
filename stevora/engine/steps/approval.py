"""`approval`: asks a person to approve, edit or reject `state[contentKey]`.

Going WAITING writes the approval request (and its `approval.requested` webhook) in the driver's
transaction; the decision arrives through `stevora.engine.commands.decide_approval`.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from stevora.clock import iso, utcnow
from stevora.db import approvals
from stevora.db.outbox import enqueue_webhooks
from stevora.definitions import ApprovalStep
from stevora.engine.steps.base import StepExecution, StepType, WaitContext
from stevora.events import Event, EventType, WebhookEvent
from stevora.tasks import StepResult

if TYPE_CHECKING:
    from stevora.runtime import Runtime

APPROVAL_SIGNAL = "approval_decision"


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
            status="waiting", signal_type=APPROVAL_SIGNAL, wait_until=until, pause_reason="approval"
        )

    async def on_waiting(self, wait: WaitContext, result: StepResult) -> list[Event]:
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
        return [
            Event(
                EventType.APPROVAL_REQUESTED,
                {**payload, "expiresAt": iso(result.wait_until)},
                wait.step_run["id"],
            )
        ]

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
