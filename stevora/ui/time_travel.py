"""Time travel in the UI (docs/ui.md, docs/time-travel.md): "Fork from here" on every step and
round of the run page opens the fork form; a fork and its origin link to each other; the diff view
puts two runs side by side.

The form creates the fork through the engine's `plan_fork` / `create_fork`, as
`POST /v1/workflow-runs/{id}/fork` does: a mistake (bad JSON, a point that does not exist, a call
of another round, a model without a provider) comes back on the form naming the field, with what
was typed kept, and nothing is stored.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from stevora.db import forks as db_forks
from stevora.db.reads import definitions as definition_reads
from stevora.db.reads import runs as run_reads
from stevora.engine import fork as forking
from stevora.engine.run_diff import CallRow, Row, TraceRow, align
from stevora.errors import NotFoundError, ValidationError
from stevora.ids import random_token
from stevora.ui import auth
from stevora.ui.auth import UiUser, current_user, runtime_of
from stevora.ui.forms import checked_form
from stevora.ui.queries import call_arguments

if TYPE_CHECKING:
    from stevora.db.reads.rows import DbRow
    from stevora.db.reads.runs import RunSummary
    from stevora.runtime import Runtime

Render = Callable[[Request, UiUser | None, str, dict[str, Any], int], Awaitable[Response]]
RESULT_FIELD = "result."  # + tool call id: the form field of a replaced result


async def run_page_context(rt: Runtime, run: DbRow) -> dict[str, Any]:
    """`forks`: the runs forked or replayed from this one (its origin is on the run row)."""
    return {"forks": await db_forks.list_forks(rt.pool, run["id"])}


# -- the fork form -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PreviousCall:
    """A tool call of the round before the fork point, whose result the form can replace."""

    id: str
    name: str
    arguments: Any
    status: str  # the trace's status, or "not run"
    output: Any
    error: str | None
    error_code: str | None

    @property
    def text(self) -> str:
        """The textarea's starting text: the recorded result as JSON (empty for a failed call)."""
        return json.dumps(self.output, indent=2, ensure_ascii=False) if self.status == "completed" else ""


def previous_calls(plan: forking.ForkPlan) -> list[PreviousCall]:
    point = plan.point
    if point.round is None or point.round < 2:
        return []
    calls = forking.previous_round_calls(point, plan.history)
    traces = {(t["llm_call_id"], t["tool_call_id"]): t for t in plan.history["traces"]}
    out = []
    for c in calls:
        for tc in (c["response"] or {}).get("toolCalls") or ():
            t = traces.get((c["id"], tc.get("id")))
            out.append(
                PreviousCall(
                    tc.get("id", ""),
                    tc.get("name", "?"),
                    call_arguments(tc.get("arguments")),
                    t["status"] if t is not None else "not run",
                    t["output_json"] if t is not None else None,
                    t["error"] if t is not None else None,
                    t["error_code"] if t is not None else None,
                )
            )
    return out


def _json(text: str, path: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ValidationError.at(path, f'not valid JSON ({exc}); quote text: "like this"') from None


def parse_state(text: str) -> dict[str, Any]:
    """The state editor: a JSON object, or `key=JSON` lines (blank lines skipped)."""
    text = text.strip()
    if not text:
        return {}
    if text.startswith("{"):
        value = _json(text, "edits.state")
        if not isinstance(value, dict):
            raise ValidationError.at("edits.state", "must be a JSON object")
        return value
    out: dict[str, Any] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValidationError.at(
                "edits.state", f"line {number}: expected KEY=JSON or a JSON object, got {line[:60]!r}"
            )
        out[key] = _json(value.strip(), f"edits.state.{key}")
    return out


def parse_edits(form: dict[str, str], previous: list[PreviousCall]) -> dict[str, Any]:
    """The form's edits as the API's `edits`: only what differs from the origin is an edit (an
    untouched result is not replaced)."""
    edits: dict[str, Any] = {}
    state = parse_state(form.get("state", ""))
    if state:
        edits["state"] = state
    results: dict[str, Any] = {}
    for call in previous:
        text = form.get(RESULT_FIELD + call.id, "").strip()
        if not text or text == call.text.strip():
            continue
        value = _json(text, f"edits.toolResults.{call.id}")
        if call.status == "completed" and value == call.output:
            continue
        results[call.id] = value
    # A result field for a call that is not of the previous round (a stale or forged form): the
    # engine names it.
    known = {c.id for c in previous}
    for name, text in form.items():
        call_id = name.removeprefix(RESULT_FIELD)
        if name.startswith(RESULT_FIELD) and call_id not in known and text.strip():
            results[call_id] = _json(text, f"edits.toolResults.{call_id}")
    if results:
        edits["toolResults"] = results
    model = form.get("model", "").strip()
    if model:
        edits["model"] = model
    prompt = form.get("systemPrompt", "")
    if prompt.strip():
        edits["systemPrompt"] = prompt
    version = form.get("definitionVersion", "").strip()
    if version:
        edits["definitionVersion"] = version
    return edits


def at_value(at: str, visit: str | None) -> Any:
    """The form's point (`agent` or `agent:3`, and the visit) as plan_fork's `at`."""
    step, rnd, _ = forking.parse_at(at)
    if visit and visit.isdigit() and int(visit) > 1:
        return {"step": step, "round": rnd, "visit": int(visit)}
    return at


def problems_of(exc: ValidationError) -> dict[str, str]:
    """path → message of a validation error."""
    found = (exc.details or {}).get("errors") if isinstance(exc.details, dict) else None
    return {str(p.get("path") or "form"): str(p.get("message")) for p in found or ()} or {"form": exc.message}


async def fork_page(
    rt: Runtime, workspace_id: str, run_id: str, at: str, visit: str | None
) -> dict[str, Any]:
    """The fork form's context at a point; with `problems["at"]` and the run's points when the
    point does not exist. NotFoundError for a run of another workspace."""
    problems: dict[str, str] = {}
    plan = None
    if at:
        try:
            plan = await forking.plan_fork(rt, workspace_id, run_id, at_value(at, visit), {})
        except ValidationError as exc:
            problems = problems_of(exc)
    else:
        problems = {"at": "choose a fork point"}
    if plan is None:
        async with rt.pool.acquire() as conn:
            origin = await forking.fork_origin(conn, workspace_id, run_id)
            points, _ = await forking.fork_points(conn, origin)
        return {"origin": origin, "points": points, "point": None, "problems": problems, "at": at}
    spec = await rt.definitions.get(plan.origin["definition_id"])
    step = next((s for s in spec.steps if s.name == plan.point.step_name), None)
    versions = [
        d["version"]
        for d in await definition_reads.choices(rt.pool, workspace_id)
        if d["name"] == spec.name and d["version"] != spec.version
    ]
    return {
        "origin": plan.origin,
        "points": plan.points,
        "point": plan.point,
        "at": plan.point.to_dict()["at"],
        "visit": plan.point.visit,
        "previous": previous_calls(plan),
        "step_model": getattr(step, "model", None),
        "step_prompt": getattr(step, "system_prompt", None),
        "version": spec.version,
        "other_versions": versions,
        "problems": problems,
        "typed": {},
        "key": "ui-fork-" + random_token(16),
    }


async def create_from_form(rt: Runtime, workspace_id: str, run_id: str, form: dict[str, str]) -> DbRow:
    """Plan and create the fork the form describes (one transaction); ValidationError naming the
    field otherwise, nothing stored."""
    at = at_value(form.get("at", ""), form.get("visit"))
    plan = await forking.plan_fork(rt, workspace_id, run_id, at, {})
    edits = parse_edits(form, previous_calls(plan))
    plan = await forking.plan_fork(rt, workspace_id, run_id, at, edits)
    definition_id = await forking.fork_definition_id(rt, plan)
    key = form.get("key", "").strip()[:200] or None
    created: DbRow = (await forking.create_fork(rt, plan, definition_id, key))[0]
    return created


def _where(step: str | None, rnd: int | None) -> str:
    return f"step '{step}'" + (f", round {rnd}" if rnd is not None else "")


# -- the diff view -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DiffView:
    a: RunSummary
    b: RunSummary
    rows: list[Row]
    inherited: set[str]  # model calls copied from an origin (not executed by their run)

    arguments = staticmethod(call_arguments)  # for display: the object the model's JSON text holds

    @property
    def first(self) -> Row | None:
        return next((r for r in self.rows if r.first_divergence), None)

    def relation(self) -> str | None:
        """How the two runs are related, if they are (a fork or replay of the other)."""
        for x, y in ((self.b, self.a), (self.a, self.b)):
            if x["forked_from_run_id"] == y["id"]:
                kind = "a replay" if x["replay_of"] else "a fork"
                return (
                    f"{x['id']} is {kind} of {y['id']} at {_where(x['forked_at_step'], x['forked_at_round'])}"
                )
        return None


async def diff_view(rt: Runtime, workspace_id: str, a: str, b: str) -> DiffView:
    """Both runs' model calls aligned (engine.run_diff, as `stevora runs diff A B`)."""
    found = []
    for field, run_id in (("a", a), ("b", b)):
        trace = await run_reads.run_trace(rt.pool, workspace_id, run_id)
        if trace is None:
            raise ValidationError.at(field, f"no run {run_id!r} in this workspace")
        found.append(trace)
    ta, tb = found
    rows = align(
        ([CallRow.of(c) for c in ta.calls], [TraceRow.of(t) for t in ta.traces]),
        ([CallRow.of(c) for c in tb.calls], [TraceRow.of(t) for t in tb.traces]),
    )
    inherited = {c["id"] for c in (*ta.calls, *tb.calls) if c["inherited_from"] is not None}
    return DiffView(ta.run, tb.run, rows, inherited)


# -- routes ------------------------------------------------------------------------------------


def add_time_travel_routes(router: APIRouter, render: Render) -> None:
    """The fork form (GET and POST `/ui/runs/{id}/fork`) and the diff view (`/ui/diff`).
    Registered before the run actions' `/runs/{id}/{action}`."""

    async def not_found(request: Request, user: UiUser, what: str) -> Response:
        return await render(request, user, "not_found.html", {"what": what, "nav": None}, 404)

    @router.get("/runs/{run_id}/fork")
    async def fork_form(request: Request, run_id: str) -> Response:
        user = await current_user(request)
        if user is None:
            return auth.login_redirect(request)
        q = request.query_params
        try:
            context = await fork_page(
                runtime_of(request), user.workspace_id, run_id, q.get("at", ""), q.get("visit")
            )
        except NotFoundError:
            return await not_found(request, user, f"Run {run_id}")
        status = 400 if context["problems"] and q.get("at") else 200
        return await render(request, user, "fork.html", {"nav": "runs", **context}, status)

    @router.post("/runs/{run_id}/fork")
    async def fork_submit(request: Request, run_id: str) -> Response:
        guarded = await checked_form(request)
        if isinstance(guarded, Response):
            return guarded
        user, form = guarded
        rt = runtime_of(request)
        try:
            fork = await create_from_form(rt, user.workspace_id, run_id, form)
        except NotFoundError:
            return await not_found(request, user, f"Run {run_id}")
        except ValidationError as exc:
            # Nothing was stored: the form again, with what was typed and the fields named.
            try:
                context = await fork_page(
                    rt, user.workspace_id, run_id, form.get("at", ""), form.get("visit")
                )
            except NotFoundError:
                return await not_found(request, user, f"Run {run_id}")
            context["problems"] = {**context["problems"], **problems_of(exc)}
            context["typed"] = form
            context["key"] = form.get("key") or context.get("key")
            return await render(request, user, "fork.html", {"nav": "runs", **context}, 400)
        response = RedirectResponse(f"/ui/runs/{fork['id']}", status_code=303)
        where = _where(fork["forked_at_step"], fork["forked_at_round"])
        auth.set_flash(response, f"Forked {run_id} at {where}: this is the new run {fork['id']}.")
        return response

    @router.get("/diff")
    async def diff_page(request: Request) -> Response:
        user = await current_user(request)
        if user is None:
            return auth.login_redirect(request)
        a, b = (request.query_params.get(k, "").strip() for k in ("a", "b"))
        context: dict[str, Any] = {"nav": "runs", "a": a, "b": b, "d": None, "problems": {}}
        if a and b:
            try:
                context["d"] = await diff_view(runtime_of(request), user.workspace_id, a, b)
            except ValidationError as exc:
                context["problems"] = problems_of(exc)
        elif a or b:
            context["problems"] = {"b" if a else "a": "give two run ids"}
        return await render(request, user, "diff.html", context, 400 if context["problems"] else 200)
