"""Client-executed tools (`"execution": "client"`): the API caller runs the tool and posts its output.

* Handed over: the step goes WAITING with the calls in its `requiredAction`, and the
  `workflow.tool_outputs_required` webhook lists every pending client call of the run.
* Due: a client tool's `timeoutMs` passed (`expire_overdue`): its call fails with
  TOOL_OUTPUT_TIMEOUT, the model gets an error result and the loop goes on; or the step's
  `outputsExpireAfterMs` passed first: the step and the run fail with CONTEXT_EXPIRED.
* Answered: `submit_tool_outputs` (`POST /v1/workflow-runs/{id}/tool-outputs`, the UI's form, the
  CLI), serialised on the run's row lock, so a call is recorded once.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import asyncpg

from stevora.clock import iso, utcnow
from stevora.db import awaited as db_awaited
from stevora.db import runs
from stevora.db.awaited import NewAwaitedCall
from stevora.db.outbox import enqueue_webhooks
from stevora.db.reads.rows import DbRow
from stevora.definitions import LlmStep, LlmToolDef
from stevora.engine import limits
from stevora.engine.hints import dispatch_hint
from stevora.engine.steps.awaited import Answer, answer, tool_call_view
from stevora.engine.steps.awaited.kind import CallKind, HandingOver, ToolEntry
from stevora.engine.steps.base import WaitContext, WaitPlan
from stevora.errors import (
    ContextExpired,
    InvalidStateTransition,
    InvalidToolOutputs,
    NotFoundError,
    ToolOutputTooLarge,
)
from stevora.events import WebhookEvent
from stevora.statuses import AnsweredBy, AwaitedKind, AwaitedStatus, PauseReason, ResumeReason, RunStatus
from stevora.tasks import StepResult
from stevora.tools import ToolOutcome

if TYPE_CHECKING:
    from stevora.runtime import Runtime


class ClientKind(CallKind):
    """Calls of an inline tool with `"execution": "client"`."""

    kind = AwaitedKind.CLIENT
    pause_reason = PauseReason.TOOL_OUTPUTS
    pause_rank = 0  # a step also waiting for other kinds says it waits for tool outputs
    details_key = "toolCalls"
    has_deadlines = True

    def answers(self, tool: ToolEntry) -> bool:
        return isinstance(tool, LlmToolDef) and tool.execution == "client"

    async def prepare(self, handing: HandingOver) -> NewAwaitedCall | ToolOutcome:
        tool = handing.tool
        assert isinstance(tool, LlmToolDef)  # `answers` took only these
        due_ms = [ms for ms in (tool.timeout_ms, client_expiry_ms(handing.step, tool)) if ms is not None]
        if not due_ms:
            return handing.call
        # The earlier of the call's timeout and its expiry (`on_due` tells which).
        return replace(handing.call, deadline_at=handing.committed_at + timedelta(milliseconds=min(due_ms)))

    def pause_detail(self, call: NewAwaitedCall, tool: ToolEntry) -> dict[str, Any]:
        return tool_call_view(
            {"tool_call_id": call.tool_call_id, "tool_name": call.tool_name, "arguments": call.arguments}
        )

    async def on_handed_over(
        self, wait: WaitContext, calls: list[NewAwaitedCall], inserted: set[str]
    ) -> WaitPlan:
        """Announce the run's pending client calls (`workflow.tool_outputs_required`)."""
        await announce_tool_outputs_required(wait.conn, wait.run)
        return WaitPlan()

    async def on_due(self, wait: WaitContext) -> StepResult | None:
        """A client tool's `timeoutMs` passed: its call fails with TOOL_OUTPUT_TIMEOUT (the model
        gets an error result and the loop goes on, as after a handler timeout). Its
        `outputsExpireAfterMs` passed (the earlier of the two): the step, and so the run, fails
        with CONTEXT_EXPIRED."""
        step = wait.step
        inline = (
            {t.name: t for t in step.tools if isinstance(t, LlmToolDef)} if isinstance(step, LlmStep) else {}
        )
        return await expire_overdue(
            wait, expires_run=lambda call: expires_first(step, inline.get(call["tool_name"]))
        )


KIND = ClientKind()


def client_expiry_ms(step: LlmStep, tool: LlmToolDef) -> int | None:
    """How long a client tool's output may be missing before the run fails with CONTEXT_EXPIRED."""
    if tool.execution != "client":
        return None
    return tool.outputs_expire_after_ms or step.outputs_expire_after_ms


def expires_first(step: LlmStep, tool: LlmToolDef | None) -> bool:
    """Whether a client call's deadline is its expiry (the run fails) rather than its own
    `timeoutMs` (the call fails and the loop goes on): the earlier one is the deadline."""
    if tool is None:
        return False
    expiry_ms = client_expiry_ms(step, tool)
    return expiry_ms is not None and (tool.timeout_ms is None or expiry_ms <= tool.timeout_ms)


async def expire_overdue(
    wait: WaitContext, *, expires_run: Callable[[DbRow], bool] = lambda call: False
) -> StepResult | None:
    """The step's wait is due: each client call past its `timeoutMs` fails with TOOL_OUTPUT_TIMEOUT
    (the model gets an error result and the loop goes on, as after a handler timeout). A lapsed
    call whose deadline is its step's expiry instead (`expires_run`: the `llm` step's
    `outputsExpireAfterMs` came first) fails the step, and so the run, with CONTEXT_EXPIRED, and
    the calls it waited for are closed unanswered. None: the step moved (or waits on)."""
    run = await runs.lock_run(wait.conn, wait.run["id"])
    assert run is not None
    now = utcnow()
    pending = await db_awaited.pending_for_run(wait.conn, run["id"])
    lapsed = [
        c
        for c in pending
        if c["kind"] == AwaitedKind.CLIENT
        and c["deadline_at"] is not None
        and c["deadline_at"] <= now
        and expires_run(c)
    ]
    if lapsed:
        await db_awaited.mark_answered(
            wait.conn, [c["id"] for c in pending if c["kind"] == AwaitedKind.CLIENT]
        )
        names = ", ".join(sorted({c["tool_name"] for c in lapsed}))
        error = ContextExpired(
            f"No output was submitted for client tool calls ({names}) before {iso(lapsed[0]['deadline_at'])}",
            details={"toolCalls": [tool_call_view(c) for c in lapsed]},
        )
        return StepResult(status="failed", error={**error.to_dict(), "retryable": False}, retryable=False)
    expired = [
        Answer(
            call,
            ok=False,
            error=f"No output was submitted for client tool '{call['tool_name']}' before {iso(call['deadline_at'])}",
            error_code="TOOL_OUTPUT_TIMEOUT",
            answered_by=AnsweredBy.TIMEOUT,
        )
        for call in pending
        if call["deadline_at"] is not None and call["deadline_at"] <= now
    ]
    # With nothing expired (an answer came first) this only re-aims the wake-up at the next
    # deadline, so the driver hands the run back instead of waking it again at once.
    await answer(wait.conn, run, expired, reason=ResumeReason.TOOL_OUTPUT_TIMEOUT, owner=wait.owner)
    return None


def required_action(client_calls: list[DbRow]) -> dict[str, Any] | None:
    """The run's `requiredAction`: its pending client calls in the model's order, else None."""
    if not client_calls:
        return None
    return {"type": "submit_tool_outputs", "toolCalls": [tool_call_view(c) for c in client_calls]}


async def announce_tool_outputs_required(conn: asyncpg.Connection, run: DbRow) -> None:
    """`workflow.tool_outputs_required` with every pending client call of the run."""
    pending = await db_awaited.pending_client_calls(conn, [run["id"]])
    if pending:
        await enqueue_webhooks(
            conn,
            run["workspace_id"],
            WebhookEvent.WORKFLOW_TOOL_OUTPUTS_REQUIRED,
            {
                "workflowRunId": run["id"],
                "status": RunStatus.WAITING,
                "toolCalls": [tool_call_view(c) for c in pending],
            },
        )


@dataclass(frozen=True, slots=True)
class ToolOutput:
    """One item of `POST /tool-outputs`: the output of a call, or the error it ended with."""

    tool_call_id: str
    output: Any = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def _same_as_recorded(item: ToolOutput, call: DbRow) -> bool:
    if call["trace_status"] is None:
        return False
    if item.ok:
        return bool(call["trace_status"] == "completed" and call["output_json"] == item.output)
    return bool(call["trace_status"] == "failed" and call["trace_error"] == item.error)


async def submit_tool_outputs(rt: Runtime, workspace_id: str, run_id: str, items: list[ToolOutput]) -> DbRow:
    """Record the outputs of client-executed tool calls; resume the run when none is pending.

    Checked in this order, before anything is written: a request whose every item equals what is
    already recorded succeeds without writing (a client retrying after a lost response); else a
    run with no pending client call → INVALID_STATE_TRANSITION; else each item → INVALID_TOOL_OUTPUTS
    (unknown id, answered differently, given twice) or TOOL_OUTPUT_TOO_LARGE. Concurrent
    submissions are serialised on the run's row, so a call is recorded once.
    """
    resumed = False
    async with rt.pool.acquire() as conn, conn.transaction():
        run: DbRow | None = await runs.get_run_in_workspace(conn, workspace_id, run_id, for_update=True)
        if run is None:
            raise NotFoundError("Workflow run not found", details={"workflowRunId": run_id})
        calls = await db_awaited.client_calls_with_results(conn, run_id)
        pending = {c["tool_call_id"]: c for c in calls if c["status"] == AwaitedStatus.PENDING}
        answered: dict[str, DbRow] = {}
        for c in calls:  # newest round first: a reused id means its latest call
            if c["status"] == AwaitedStatus.ANSWERED:
                answered.setdefault(c["tool_call_id"], c)
        if all(i.tool_call_id in answered and _same_as_recorded(i, answered[i.tool_call_id]) for i in items):
            return run
        if run["status"] != RunStatus.WAITING or not pending:
            raise InvalidStateTransition(
                "Workflow run is not waiting for tool outputs",
                details={"workflowRunId": run_id, "status": run["status"]},
            )
        answers = _validated_answers(rt, items, pending, answered)
        if answers:
            resumed = await answer(conn, run, answers, reason=ResumeReason.TOOL_OUTPUTS)
    if resumed:
        await dispatch_hint(rt.dispatcher, run_id)
    return run


def _validated_answers(
    rt: Runtime,
    items: list[ToolOutput],
    pending: dict[str, DbRow],
    answered: dict[str, DbRow],
) -> list[Answer]:
    limit = rt.settings.max_tool_output_bytes
    answers: list[Answer] = []
    seen: set[str] = set()
    for index, item in enumerate(items):
        call_id = item.tool_call_id
        where = {"toolCallId": call_id, "index": index}
        if call_id in seen:
            raise InvalidToolOutputs(
                f"Tool call '{call_id}' is answered twice in this request", details=where
            )
        seen.add(call_id)
        call = pending.get(call_id)
        if call is None:
            if call_id in answered:
                if _same_as_recorded(item, answered[call_id]):
                    continue  # resubmitted as recorded: nothing to do for this item
                raise InvalidToolOutputs(
                    f"Tool call '{call_id}' was already answered with a different result", details=where
                )
            raise InvalidToolOutputs(f"Tool call '{call_id}' is not a call this run waits for", details=where)
        field = f"toolOutputs[{index}].{'output' if item.ok else 'error'}"
        limits.check_value(rt.settings, item.output if item.ok else item.error, field)
        size = len(json.dumps(item.output if item.ok else item.error, ensure_ascii=False).encode("utf-8"))
        if size > limit:
            raise ToolOutputTooLarge(
                f"Output for tool call '{call_id}' is {size} bytes, over the {limit}-byte limit",
                details={**where, "bytes": size, "limitBytes": limit},
            )
        if item.ok:
            answers.append(Answer(call, ok=True, output=item.output))
        else:
            answers.append(Answer(call, ok=False, error=item.error, error_code="TOOL_ERROR"))
    return answers
