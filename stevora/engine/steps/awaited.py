"""Tool calls answered from outside the loop: the room for every way a call's result can be
written by someone other than the `llm` step itself.

* the API caller, for client-executed tools (`commands.submit_tool_outputs`);
* a child run, for workflows called as tools (`endings` tells the parent when the child ends;
  the recovery sweep repeats it if that could not happen);
* the clock, when a client tool's `timeoutMs` passes (`LlmStepType.on_due`);
* a person, for approval-gated tools (`commands.decide_approval`): `rejected` answers the call
  with an error; `approved` / `edited` marks it approved, and the resumed step runs it.

The loop hands such calls over by returning a waiting StepResult; `LlmStepType.on_waiting` writes
them (and creates child runs) in the transaction that makes the step WAITING, so no worker, lease
or task is held while they are out. `answer` writes each result's `tool_trace` row and event in one
transaction (fenced by the run being WAITING and its row lock), exactly once, and resumes the step
when nothing is pending any more: the loop then rebuilds the transcript from the rows and calls
the model with every result, in the model's order.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from stevora.clock import utcnow
from stevora.db import awaited as db_awaited
from stevora.db import checkpoints, runs
from stevora.db.awaited import NewAwaitedCall
from stevora.db.checkpoints import ToolTraceRecord
from stevora.db.outbox import enqueue_webhooks
from stevora.db.runs import RELEASE
from stevora.engine.steps.approval import open_request
from stevora.engine.steps.base import WaitContext
from stevora.events import Event, EventType, WebhookEvent
from stevora.statuses import RunStatus, StepStatus

CLIENT = "client"
WORKFLOW = "workflow"
APPROVAL = "approval"


@dataclass(slots=True)
class Answer:
    """What to record for one awaited call."""

    call: asyncpg.Record  # the awaited_tool_calls row
    ok: bool
    output: Any = None
    error: str | None = None
    error_code: str | None = None
    model_error: dict[str, Any] | None = None  # what the model is told instead of {"error": error}
    answered_by: str = CLIENT  # client | workflow | timeout


def idempotency_key(call: Mapping[str, Any]) -> str:
    """The key a handler gets for this call: `<stepRunId>:<round>:<index>`, or `<stepRunId>:tool`
    for a `tool` step's call."""
    if call["llm_call_id"] is None:
        return f"{call['step_run_id']}:tool"
    return f"{call['step_run_id']}:{call['round']}:{call['sequence']}"


def tool_call_view(call: Mapping[str, Any]) -> dict[str, Any]:
    """A pending call as clients see it: `{"id", "name", "arguments"}` (the model's id)."""
    return {"id": call["tool_call_id"], "name": call["tool_name"], "arguments": call["arguments"]}


def required_action(client_calls: list[asyncpg.Record]) -> dict[str, Any] | None:
    """The run's `requiredAction`: its pending client calls in the model's order, else None."""
    if not client_calls:
        return None
    return {"type": "submit_tool_outputs", "toolCalls": [tool_call_view(c) for c in client_calls]}


async def announce_tool_outputs_required(conn: asyncpg.Connection, run: asyncpg.Record) -> None:
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


async def answer(
    conn: asyncpg.Connection,
    run: asyncpg.Record,
    answers: list[Answer],
    *,
    reason: str,
    owner: str | None = None,
    approved: Mapping[str, Any] | None = None,
    events_before: Sequence[Event] = (),
) -> bool:
    """Record `answers` (and `approved`: awaited id → the arguments a person approved) for the
    WAITING, row-locked `run`; resume its step if nothing else is pending.

    Returns True when the run went back to RUNNING. Without `owner` the lease is left free and
    the caller dispatches the run after commit; with it (the driver, on a timeout) the caller
    keeps the lease and carries on.
    """
    answers = sorted(answers, key=lambda a: (a.call["round"], a.call["sequence"]))
    approved = approved or {}
    answered_ids = {a.call["id"] for a in answers} | set(approved)
    remaining = [p for p in await db_awaited.pending_for_run(conn, run["id"]) if p["id"] not in answered_ids]
    now = utcnow()
    records: list[ToolTraceRecord] = []
    events: list[Event] = list(events_before)
    for a in answers:
        rec, event = _trace(a, now)
        records.append(rec)
        events.append(event)
    await checkpoints.insert_tool_traces(conn, run["id"], records)
    await db_awaited.mark_answered(conn, [a.call["id"] for a in answers])
    for awaited_id, arguments in approved.items():
        await db_awaited.mark_approved(conn, awaited_id, arguments)
    step_run_id = run["current_step_run_id"]
    if remaining:
        deadlines = [p["deadline_at"] for p in remaining if p["deadline_at"] is not None]
        next_due = min(deadlines) if deadlines else None
        await runs.update_step(conn, step_run_id, expect=[StepStatus.WAITING], sets={"wait_until": next_due})
        await runs.update_run(
            conn,
            run["id"],
            expect=[RunStatus.WAITING],
            owner=owner,
            sets={"next_run_at": next_due},
            events=events,
        )
        return False
    step = await runs.update_step(
        conn,
        step_run_id,
        expect=[StepStatus.WAITING],
        sets={"status": StepStatus.RUNNING, "wait_until": None},
    )
    events.append(
        Event(EventType.WORKFLOW_RESUMED, {"reason": reason, "stepName": step["step_name"]}, step_run_id)
    )
    await runs.update_run(
        conn,
        run["id"],
        expect=[RunStatus.WAITING],
        owner=owner,
        sets={"status": RunStatus.RUNNING, "next_run_at": None, **({} if owner else RELEASE)},
        now_columns=[] if owner else ["dispatched_at"],
        events=events,
    )
    return True


def _trace(a: Answer, now: Any) -> tuple[ToolTraceRecord, Event]:
    call = a.call
    duration_ms = max(0.0, (now - call["created_at"]).total_seconds() * 1000)
    model_error = a.model_error if a.model_error is not None else {"error": a.error}
    rec = ToolTraceRecord(
        step_run_id=call["step_run_id"],
        llm_call_id=call["llm_call_id"],
        round=call["round"],
        sequence=call["sequence"],
        tool_call_id=call["tool_call_id"],
        tool_name=call["tool_name"],
        input_json=call["arguments"],
        output_json=a.output if a.ok else None,
        status="completed" if a.ok else "failed",
        error=None if a.ok else a.error,
        error_code=None if a.ok else a.error_code,
        result_text=None if a.ok else json.dumps(model_error, ensure_ascii=False),
        duration_ms=duration_ms,
        idempotency_key=idempotency_key(call),
        child_run_id=call["child_run_id"],
    )
    payload: dict[str, Any] = {
        "toolTraceId": rec.id,
        "llmCallId": rec.llm_call_id,
        "toolName": rec.tool_name,
        "toolCallId": rec.tool_call_id,
        "round": rec.round,
        "sequence": rec.sequence,
        "durationMs": round(duration_ms, 3),
        "answeredBy": a.answered_by,
    }
    if call["child_run_id"] is not None:
        payload["childRunId"] = call["child_run_id"]
    if not a.ok:
        payload.update(error=a.error, errorCode=a.error_code)
    event = Event(
        EventType.TOOL_CALL_COMPLETED if a.ok else EventType.TOOL_CALL_FAILED, payload, call["step_run_id"]
    )
    return rec, event


async def answer_from_child(conn: asyncpg.Connection, child: asyncpg.Record, wake: list[str]) -> None:
    """Called in the child's terminal transaction: write the parent's result for the call that
    started `child`, and wake the parent when it has nothing else pending. A parent that is not
    WAITING (cancelled, or not yet waiting) is left alone; the sweep retries the latter."""
    call = await db_awaited.for_child(conn, child["id"])
    if call is None or call["status"] != "pending":
        return
    parent = await runs.lock_run(conn, call["workflow_run_id"])
    if parent is None or parent["status"] != RunStatus.WAITING:
        return
    result = await _child_result(conn, child, call)
    if await answer(conn, parent, [result], reason="child_run"):
        wake.append(parent["id"])


async def _child_result(conn: asyncpg.Connection, child: asyncpg.Record, call: asyncpg.Record) -> Answer:
    if child["status"] == RunStatus.COMPLETED:
        return Answer(call, ok=True, output=child["output"], answered_by=WORKFLOW)
    name = await conn.fetchval("SELECT name FROM workflow_definitions WHERE id = $1", child["definition_id"])
    error = child["error"] or {}
    code = error.get("code") or child["status"]
    message = error.get("message") or ("Run was cancelled" if child["status"] == RunStatus.CANCELLED else "")
    text = f"Workflow '{name}' run {child['id']} {child['status']}: {code}: {message}"
    return Answer(
        call,
        ok=False,
        error=text,
        error_code="CHILD_RUN_CANCELLED" if child["status"] == RunStatus.CANCELLED else "CHILD_RUN_FAILED",
        model_error={"error": text, "childRunId": child["id"]},
        answered_by=WORKFLOW,
    )


async def answer_finished_children(pool: asyncpg.Pool) -> list[str]:
    """Recovery: answer workflow calls whose child ended while the parent could not be told.
    Returns the parent runs to dispatch."""
    wake: list[str] = []
    for row in await db_awaited.unanswered_finished_children(pool):
        async with pool.acquire() as conn, conn.transaction():
            child = await runs.lock_run(conn, row["child_run_id"])
            if child is not None:
                await answer_from_child(conn, child, wake)
    return wake


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
