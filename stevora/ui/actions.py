"""The UI's forms that change things: run commands (cancel, retry, pause, resume, signal, budget)
and starting a run from a definition page.

Every form is a POST with the session's CSRF token (as the approval forms) and calls the same
engine command the API calls (`stevora.ui.commands`). The answer is a redirect back to the page
with a one-time flash message, so a reload never repeats the action.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, RedirectResponse, Response
from pydantic import ValidationError as PydanticValidationError

from stevora.definitions import Budget, problems_from_pydantic
from stevora.engine import commands
from stevora.engine.budget import update_budget
from stevora.errors import StevoraError, ValidationError
from stevora.ui import auth, queries
from stevora.ui.auth import UiUser, runtime_of
from stevora.ui.forms import checked_form
from stevora.ui.run_input import input_references, json_object, parse_run_input

Render = Callable[[Request, UiUser | None, str, dict[str, Any], int], Awaitable[Response]]
RUN_ACTIONS = ("cancel", "retry", "pause", "resume", "signal", "budget")
_DONE = {
    "cancel": "Cancelled the run.",
    "retry": "Retrying the failed step.",
    "pause": "Paused; the worker stops at its next checkpoint.",
    "resume": "Resumed the run.",
}


def _problems_text(exc: StevoraError) -> str:
    """A validation error as `path: message` lines; any other error as its message."""
    problems = (exc.details or {}).get("errors") if isinstance(exc.details, dict) else None
    if not problems:
        return exc.message
    return "; ".join(f"{p.get('path')}: {p.get('message')}" if p.get("path") else str(p.get("message"))
                     for p in problems)  # fmt: skip


async def _run_action(request: Request, user: UiUser, run_id: str, action: str, form: dict[str, str]) -> str:
    """Apply one command; returns the flash text."""
    rt = runtime_of(request)
    if action == "cancel":
        await commands.cancel_run(rt, user.workspace_id, run_id)
    elif action == "retry":
        await commands.retry_run(rt, user.workspace_id, run_id)
    elif action == "pause":
        await commands.pause_run(rt, user.workspace_id, run_id)
    elif action == "resume":
        await commands.resume_run(rt, user.workspace_id, run_id, None, None)
    elif action == "budget":
        _, resumed = await update_budget(rt, user.workspace_id, run_id, _budget_form(form))
        return "Saved the budget." + (" The run continues." if resumed else "")
    else:
        signal_type = form.get("signalType", "").strip()
        if not signal_type:
            raise ValidationError.from_problems([{"path": "signalType", "message": "Field required"}])
        payload = json_object(form.get("payload", ""), "payload") or None
        await commands.resume_run(rt, user.workspace_id, run_id, signal_type, payload)
        return f"Sent signal '{signal_type}'; the run continues."
    return _DONE[action]


_BUDGET_FIELDS = {"maxCostCents": float, "maxModelCalls": int, "maxToolCalls": int}


def _budget_form(form: dict[str, str]) -> Budget:
    """The budget form's non-empty fields as a `Budget` (an empty field keeps the run's limit)."""
    given: dict[str, Any] = {}
    problems: list[dict[str, str]] = []
    for name, kind in _BUDGET_FIELDS.items():
        text = form.get(name, "").strip()
        if not text:
            continue
        try:
            given[name] = kind(text)
        except ValueError:
            problems.append(
                {"path": name, "message": f"'{text[:40]}' is not a {'whole ' if kind is int else ''}number"}
            )
    if problems:
        raise ValidationError.from_problems(problems)
    try:
        return Budget.model_validate(given)
    except PydanticValidationError as exc:
        raise ValidationError.from_problems(problems_from_pydantic(exc)) from exc


async def definition_context(
    request: Request,
    user: UiUser,
    definition_id: str,
    *,
    input_text: str | None = None,
    error: str | None = None,
) -> dict[str, Any] | None:
    """The definition page: the definition, its recent runs and the start-a-run form."""
    found = await queries.definition(runtime_of(request), user.workspace_id, definition_id)
    if found is None:
        return None
    row, runs = found
    if input_text is None:
        # Prefill the keys the definition's templates read, so the form says what it needs.
        input_text = json.dumps({key: "" for key in input_references(row["steps"])}, indent=2)
    return {"nav": "definitions", "d": row, "runs": runs, "input_text": input_text, "start_error": error}


def add_action_routes(router: APIRouter, render: Render) -> None:
    """Register the action POSTs on the UI router."""

    @router.post("/runs/{run_id}/{action}")
    async def run_action(request: Request, run_id: str, action: str) -> Response:
        guarded = await checked_form(request)
        if isinstance(guarded, Response):
            return guarded
        user, form = guarded
        response = RedirectResponse(f"/ui/runs/{run_id}", status_code=303)
        if action not in RUN_ACTIONS:
            auth.set_flash(response, f"Unknown action '{action}'.", "error")
            return response
        try:
            auth.set_flash(response, await _run_action(request, user, run_id, action, form))
        except StevoraError as exc:
            auth.set_flash(response, f"{exc.code}: {_problems_text(exc)}", "error")
        return response

    @router.post("/definitions/{definition_id}/runs")
    async def start_run(request: Request, definition_id: str) -> Response:
        guarded = await checked_form(request)
        if isinstance(guarded, Response):
            return guarded
        user, form = guarded
        text = form.get("input", "")
        context = await definition_context(request, user, definition_id, input_text=text)
        if context is None:
            return PlainTextResponse("Definition not found", status_code=404)
        try:
            value = parse_run_input(text, context["d"]["steps"])
            run, _ = await commands.create_run(runtime_of(request), user.workspace_id, definition_id, value)
        except StevoraError as exc:
            context["start_error"] = f"{exc.code}: {_problems_text(exc)}"
            return await render(
                request, user, "definition.html", context, 400 if exc.http_status < 500 else 500
            )
        response = RedirectResponse(f"/ui/runs/{run['id']}", status_code=303)
        auth.set_flash(response, f"Started run {run['id']}.")
        return response
