"""Tool calls answered from outside the loop: one module per way a call's result can be written
by someone other than the step itself (each a `kind.CallKind`, registered in
`stevora.engine.steps.awaited_kinds`), and the `answer` they all write through.

* `client.py`: the API caller, for client-executed tools (`submit_tool_outputs`), and the clock
  when a client tool's `timeoutMs` passes (`expire_overdue`, the `llm` step's due wait);
* `workflow.py`: a child run, for workflows called as tools (child runs are created as the step
  goes WAITING; `endings` tells the parent when the child ends, and the recovery sweep repeats it
  if that could not happen);
* `stevora.engine.steps.approval`: a person, for approval-gated tools (`decide_approval`):
  `rejected` answers the call with an error; `approved` / `edited` marks it approved, and the
  resumed step runs it.

The loop hands such calls over by returning a waiting StepResult; its step type's `on_waiting`
calls `AWAITED_KINDS.hand_over`, which records them and lets each kind write what its calls need
(child runs, webhooks, approval requests) in the transaction that makes the step WAITING, so no worker,
lease or task is held while they are out. `answer` writes each result's `tool_trace` row and event
in one transaction (fenced by the run being WAITING and its row lock), exactly once, and resumes
the step when nothing is pending any more: the loop then rebuilds the transcript from the rows and
calls the model with every result, in the model's order.
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
from stevora.db.checkpoints import ToolTraceRecord
from stevora.db.reads.rows import DbRow
from stevora.db.runs import RELEASE
from stevora.engine.steps.tool_calls import row_key, tool_call_event
from stevora.events import Event, EventType
from stevora.statuses import AnsweredBy, ResumeReason, RunStatus, StepStatus


@dataclass(slots=True)
class Answer:
    """What to record for one awaited call."""

    call: DbRow  # the awaited_tool_calls row
    ok: bool
    output: Any = None
    error: str | None = None
    error_code: str | None = None
    model_error: dict[str, Any] | None = None  # what the model is told instead of {"error": error}
    answered_by: AnsweredBy = AnsweredBy.CLIENT


def tool_call_view(call: Mapping[str, Any]) -> dict[str, Any]:
    """A pending call as clients see it: `{"id", "name", "arguments"}` (the model's id)."""
    return {"id": call["tool_call_id"], "name": call["tool_name"], "arguments": call["arguments"]}


async def answer(
    conn: asyncpg.Connection,
    run: DbRow,
    answers: list[Answer],
    *,
    reason: ResumeReason,
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
        idempotency_key=row_key(call),
        child_run_id=call["child_run_id"],
    )
    event_type, payload = tool_call_event(rec, answered_by=a.answered_by)
    event = Event(event_type, payload, call["step_run_id"])
    return rec, event
