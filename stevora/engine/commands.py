"""Commands from outside the worker: create, cancel, retry, pause, resume, decide an approval,
submit tool outputs.

Each command is one transaction of guarded updates plus its events; it records *what happened*
(a signal arrived, a decision was made) and dispatches the run. The worker's driver then works
out what follows, so the flow logic lives in one place (driver.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import asyncpg
import structlog

from stevora.db import approvals, runs
from stevora.db import awaited as db_awaited
from stevora.db.outbox import enqueue_webhooks
from stevora.db.runs import RELEASE
from stevora.definitions import Budget
from stevora.definitions.flow import Concurrency
from stevora.engine import budget as budget_rules
from stevora.engine import endings, flow, limits
from stevora.engine.hints import dispatch_hint
from stevora.engine.steps import awaited
from stevora.engine.steps.approval import APPROVAL_SIGNAL
from stevora.errors import (
    ConflictError,
    InvalidStateTransition,
    InvalidToolOutputs,
    NotFoundError,
    ToolOutputTooLarge,
    ValidationError,
)
from stevora.events import Event, EventType, WebhookEvent, step_completed, step_failed
from stevora.observability import tracing
from stevora.observability.metrics import RUNS_CREATED
from stevora.statuses import RunStatus, StepStatus
from stevora.tools import schema_problems, with_defaults

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
    budget: Budget | None = None,
    concurrency: Concurrency | None = None,
    priority: int | None = None,
) -> tuple[asyncpg.Record, bool]:
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
                [_field_problem(problem) for problem in problems],
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


_FIELD_PATH = re.compile(r"[A-Za-z_$][\w$-]*(\[\d+\]|\.[A-Za-z_$][\w$-]*)*")


def _field_problem(problem: str, field: str = "input") -> dict[str, str]:
    """`"customer.id: 1 is not of type 'string'"` → `{"path": "input.customer.id", "message": ...}`
    (`field` names the request field the checked object came in)."""
    path, sep, message = problem.partition(": ")
    if sep and _FIELD_PATH.fullmatch(path):
        return {"path": f"{field}.{path}", "message": message}
    return {"path": field, "message": problem}


async def cancel_run(rt: Runtime, workspace_id: str, run_id: str) -> asyncpg.Record:
    wake: list[str] = []
    async with rt.pool.acquire() as conn, conn.transaction():
        await _owned_run(conn, workspace_id, run_id)
        row = await endings.cancel_run(conn, run_id, wake=wake)
    for other in wake:
        await dispatch_hint(rt.dispatcher, other)
    return row


async def retry_run(rt: Runtime, workspace_id: str, run_id: str) -> asyncpg.Record:
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
                "crash_count": 0,
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
            limits.check_state_merge(rt.settings, run["state"], payload)
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
    completes; rejected → the step fails with APPROVAL_REJECTED (not retried) and so does the run.

    For an approval-gated tool call: approved → the call runs; edited → it runs with `editedContent`
    as its arguments (checked against the tool's schema now: a bad edit is a VALIDATION_ERROR and
    nothing is recorded); rejected → the model gets an error result saying a person declined it.
    """
    if decision == "edited" and edited_content is None:
        raise ValidationError.from_problems(
            [{"path": "editedContent", "message": "editedContent is required when decision is 'edited'"}]
        )
    if edited_content is not None:
        limits.check_value(rt.settings, edited_content, "editedContent")
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
        if approval["awaited_tool_call_id"] is not None:
            resumed = await _decide_tool_call(
                conn, workspace_id, approval, decision, edited_content, decided_by
            )
        else:
            if decision == "edited":
                run = await runs.get_run(conn, approval["workflow_run_id"])
                limits.check_state_merge(
                    rt.settings, run["state"] if run else None, {approval["content_key"]: edited_content}
                )
            await _decide_step(conn, workspace_id, approval, decision, edited_content, decided_by)
            resumed = True
    # Dispatch only after commit: a claim that runs earlier still sees the run WAITING.
    if resumed:
        await dispatch_hint(rt.dispatcher, approval["workflow_run_id"])
    return approval


async def _decide_step(
    conn: asyncpg.Connection,
    workspace_id: str,
    approval: asyncpg.Record,
    decision: Decision,
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


async def _decide_tool_call(
    conn: asyncpg.Connection,
    workspace_id: str,
    approval: asyncpg.Record,
    decision: Decision,
    edited_content: Any,
    decided_by: str | None,
) -> bool:
    """The decision on an approval-gated tool call, in the decision's transaction; True when the
    run resumed (the caller dispatches it after commit)."""
    call = await db_awaited.get(conn, approval["awaited_tool_call_id"])
    run = await runs.lock_run(conn, approval["workflow_run_id"])
    if call is None or run is None or run["status"] != RunStatus.WAITING or call["status"] != "pending":
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
    if decision == "rejected":
        by = f" ({decided_by})" if decided_by else ""
        declined = awaited.Answer(
            call,
            ok=False,
            error=f"A person declined this call to '{call['tool_name']}'{by}",
            error_code="APPROVAL_REJECTED",
            answered_by="person",
        )
        resumed = await awaited.answer(conn, run, [declined], reason="approval", events_before=before)
    else:
        arguments = call["arguments"] if decision == "approved" else edited_content
        if decision == "edited":
            _check_edited_arguments(call, edited_content)
        resumed = await awaited.answer(
            conn, run, [], reason="approval", approved={call["id"]: arguments}, events_before=before
        )
    await enqueue_webhooks(
        conn, workspace_id, WebhookEvent.APPROVAL_DECIDED, {**decided, "workflowRunId": run["id"]}
    )
    return resumed


def _check_edited_arguments(call: asyncpg.Record, edited: Any) -> None:
    if not isinstance(edited, dict):
        raise ValidationError.from_problems(
            [{"path": "editedContent", "message": "Edited tool arguments must be a JSON object"}]
        )
    if call["parameters"] is not None:
        problems = schema_problems(call["parameters"], edited)
        if problems:
            raise ValidationError.from_problems(
                [_field_problem(problem, "editedContent") for problem in problems]
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


def _same_as_recorded(item: ToolOutput, call: asyncpg.Record) -> bool:
    if call["trace_status"] is None:
        return False
    if item.ok:
        return bool(call["trace_status"] == "completed" and call["output_json"] == item.output)
    return bool(call["trace_status"] == "failed" and call["trace_error"] == item.error)


async def submit_tool_outputs(
    rt: Runtime, workspace_id: str, run_id: str, items: list[ToolOutput]
) -> asyncpg.Record:
    """Record the outputs of client-executed tool calls; resume the run when none is pending.

    Checked in this order, before anything is written: a request whose every item equals what is
    already recorded succeeds without writing (a client retrying after a lost response); else a
    run with no pending client call → INVALID_STATE_TRANSITION; else each item → INVALID_TOOL_OUTPUTS
    (unknown id, answered differently, given twice) or TOOL_OUTPUT_TOO_LARGE. Concurrent
    submissions are serialised on the run's row, so a call is recorded once.
    """
    resumed = False
    async with rt.pool.acquire() as conn, conn.transaction():
        run = await runs.get_run_in_workspace(conn, workspace_id, run_id, for_update=True)
        if run is None:
            raise NotFoundError("Workflow run not found", details={"workflowRunId": run_id})
        calls = await db_awaited.client_calls_with_results(conn, run_id)
        pending = {c["tool_call_id"]: c for c in calls if c["status"] == "pending"}
        answered: dict[str, asyncpg.Record] = {}
        for c in calls:  # newest round first: a reused id means its latest call
            if c["status"] == "answered":
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
            resumed = await awaited.answer(conn, run, answers, reason="tool_outputs")
    if resumed:
        await dispatch_hint(rt.dispatcher, run_id)
    return run


def _validated_answers(
    rt: Runtime,
    items: list[ToolOutput],
    pending: dict[str, asyncpg.Record],
    answered: dict[str, asyncpg.Record],
) -> list[awaited.Answer]:
    limit = rt.settings.max_tool_output_bytes
    answers: list[awaited.Answer] = []
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
            answers.append(awaited.Answer(call, ok=True, output=item.output))
        else:
            answers.append(awaited.Answer(call, ok=False, error=item.error, error_code="TOOL_ERROR"))
    return answers
