"""The run page's side of awaited tool calls: the client-executed calls a run waits for, with a
form to answer each (a person acting as the tool), and the links between a parent run's tool call
and the child run that answers it."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from fastapi.responses import RedirectResponse, Response

from stevora.db import awaited as db_awaited
from stevora.db.reads import approvals as approval_reads
from stevora.engine.steps.awaited.client import ToolOutput, submit_tool_outputs
from stevora.errors import StevoraError
from stevora.statuses import AwaitedKind, RunStatus
from stevora.ui import auth

if TYPE_CHECKING:
    from stevora.db.reads.rows import DbRow
    from stevora.runtime import Runtime


async def run_page_context(rt: Runtime, run: DbRow) -> dict[str, Any]:
    """`pending_calls` (client calls the run waits for, in the model's order), `child_runs`
    (`"<llm call id>:<index>"` → the child run answering that workflow-tool call),
    `client_call_ids` (every call answered, or to be answered, by the client) and
    `call_approvals` (tool-call id → the pending approval request gating that call) and
    `run_approvals` (every pending approval of a WAITING run, for the call to action at the top)."""
    pending: list[DbRow] = []
    if run["status"] == RunStatus.WAITING:
        pending = await db_awaited.pending_client_calls(rt.pool, [run["id"]])
    awaited = await db_awaited.for_run_page(rt.pool, run["id"])
    gated = await approval_reads.gating_calls(rt.pool, run["id"])
    waiting_for_people = (
        await approval_reads.pending_of_run(rt.pool, run["id"]) if run["status"] == RunStatus.WAITING else []
    )
    return {
        "awaited_calls": awaited,
        "run_approvals": waiting_for_people,
        "pending_calls": pending,
        "pending_call_ids": {c["tool_call_id"] for c in pending},
        "child_runs": {
            f"{c['llm_call_id']}:{c['sequence']}": c["child_run_id"] for c in awaited if c["child_run_id"]
        },
        "client_call_ids": {c["tool_call_id"] for c in awaited if c["kind"] == AwaitedKind.CLIENT},
        "call_approvals": {a["tool_call_id"]: a["id"] for a in gated},
    }


def parse_answer(form: dict[str, str]) -> ToolOutput:
    """The form's answer: `output` as JSON, or `error` as a message. ValueError says what is wrong."""
    call_id = form.get("tool_call_id", "").strip()
    if not call_id:
        raise ValueError("The form names no tool call; reload the page and try again.")
    if form.get("answer") == "error":
        message = form.get("error", "").strip()
        if not message:
            raise ValueError(f"Give an error message for tool call {call_id}.")
        return ToolOutput(call_id, error=message)
    text = form.get("output", "")
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ValueError(
            f"The output for tool call {call_id} is not valid JSON ({exc}). Nothing was recorded; "
            'to send text, quote it: "like this".'
        ) from None
    return ToolOutput(call_id, output=value)


async def record_answer(rt: Runtime, workspace_id: str, run_id: str, form: dict[str, str]) -> Response:
    """Record the form's answer to one call (nothing on a mistake), then back to the run page with
    a message saying what happened."""
    response = RedirectResponse(f"/ui/runs/{run_id}", status_code=303)
    try:
        item = parse_answer(form)
        await submit_tool_outputs(rt, workspace_id, run_id, [item])
    except ValueError as exc:
        auth.set_flash(response, str(exc), "error")
        return response
    except StevoraError as exc:
        auth.set_flash(response, f"{exc.code}: {exc.message}", "error")
        return response
    what = "an error" if item.error is not None else "the output"
    auth.set_flash(response, f"Recorded {what} for tool call {item.tool_call_id}.")
    return response
