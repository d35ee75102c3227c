"""The web UI: server-rendered pages under /ui (Jinja2), a little plain JS, no build step.

Pages: runs list, run page (live over SSE), approvals inbox, definitions. Every page needs the
`stevora_key` cookie (see stevora.ui.auth) and shows only that key's workspace. Mount with:

    app.include_router(build_ui_router())
    mount_static(app)
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import FileResponse, PlainTextResponse, RedirectResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from stevora.attachments import attachment_refs, is_sha256
from stevora.db import blobs
from stevora.engine import provider_limits
from stevora.engine.steps.approval import Decision, decide_approval
from stevora.errors import RateLimitError, StevoraError
from stevora.request_checks import reject_nul
from stevora.statuses import TERMINAL_RUN_STATUSES
from stevora.ui import auth, queries, time_travel, waterfall
from stevora.ui.actions import add_action_routes, definition_context
from stevora.ui.auth import UiUser, current_user, runtime_of
from stevora.ui.format import FILTERS, run_duration_ms
from stevora.ui.forms import checked_form, read_form
from stevora.ui.search import datetime_local, filter_query, parse_run_filters
from stevora.ui.stream import EVENT_TYPES, run_events
from stevora.ui.threads import add_thread_routes
from stevora.ui.tool_outputs import parse_answer, record_answer, run_page_context
from stevora.ui.triggers import add_trigger_routes

HERE = Path(__file__).parent
STATIC_DIR = HERE / "static"
DECISIONS: dict[str, Decision] = {"approved": "approved", "rejected": "rejected", "edited": "edited"}
VERBS = {"approved": "Approved", "rejected": "Rejected", "edited": "Edited and approved"}
# Pages hold workspace data and run only our own script/style files. Inline style *attributes*
# are allowed (`style-src-attr`): the waterfall positions its bars with them; they cannot run script.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
    "style-src-attr 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def _static_versions() -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()[:10] for p in STATIC_DIR.iterdir() if p.is_file()
    }


def _templates() -> Jinja2Templates:
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    env = templates.env
    env.filters.update(FILTERS)
    env.filters["datetime_local"] = datetime_local
    versions = _static_versions()
    env.globals["static_url"] = lambda name: f"/ui/static/{name}?v={versions.get(name, '0')}"
    env.globals["run_duration_ms"] = run_duration_ms
    env.filters["attachments"] = attachment_refs  # images and files a stored value names by hash
    env.globals["TERMINAL"] = TERMINAL_RUN_STATUSES
    env.globals["RUN_STATUSES"] = queries.RUN_STATUSES
    env.trim_blocks = True
    env.lstrip_blocks = True
    return templates


def mount_static(app: FastAPI) -> None:
    """Serve the UI's CSS and JS at /ui/static, and its icon at /favicon.ico (where browsers ask
    for it on every page without a `<link rel="icon">`: the API docs, /metrics, JSON answers)."""
    app.mount("/ui/static", StaticFiles(directory=str(STATIC_DIR)), name="ui-static")

    async def favicon() -> FileResponse:
        return FileResponse(STATIC_DIR / "favicon.svg", media_type="image/svg+xml")

    app.add_api_route("/favicon.ico", favicon, methods=["GET"], include_in_schema=False)


_MAX_INT32 = 2**31 - 1  # page numbers and event sequences end up in integer SQL parameters


def _int(value: str | None, default: int) -> int:
    """`value` as a non-negative 32-bit integer; `default` for anything else (`²`, `-1`, 2^40)."""
    text = (value or "").strip()
    if not (text.isascii() and text.isdigit()) or int(text) > _MAX_INT32:
        return default
    return int(text)


def build_ui_router() -> APIRouter:
    """The /ui routes (pages, fragments, the SSE stream and the decision form)."""
    # The API's NUL check on every route (path, query, form): PostgreSQL text cannot hold U+0000.
    router = APIRouter(
        prefix="/ui", include_in_schema=False, route_class=auth.UiRoute, dependencies=[Depends(reject_nul)]
    )
    templates = _templates()

    async def render(
        request: Request, user: UiUser | None, name: str, context: dict[str, Any], status_code: int = 200
    ) -> Response:
        flash = auth.read_flash(request)
        pending = await queries.pending_approval_count(runtime_of(request), user.workspace_id) if user else 0
        response = templates.TemplateResponse(
            request,
            name,
            {"user": user, "flash": flash, "pending_count": pending, **context},
            status_code=status_code,
            headers=SECURITY_HEADERS,
        )
        if flash:
            auth.clear_flash(response)
        return response

    async def not_found(request: Request, user: UiUser, what: str) -> Response:
        return await render(request, user, "not_found.html", {"what": what, "nav": None}, status_code=404)

    @router.get("")
    @router.get("/")
    async def home() -> RedirectResponse:
        return RedirectResponse("/ui/runs", status_code=303)

    # -- login ------------------------------------------------------------------------------

    @router.get("/login")
    async def login_page(request: Request) -> Response:
        target = auth.safe_next(request.query_params.get("next"))
        if await current_user(request) is not None:
            return RedirectResponse(target, status_code=303)
        return await render(request, None, "login.html", {"next": target, "error": None})

    @router.post("/login")
    async def login(request: Request) -> Response:
        form = await read_form(request)
        target = auth.safe_next(form.get("next"))
        if not auth.same_origin(request):
            return PlainTextResponse("Cross-site login refused", status_code=403)
        raw_key = form.get("key", "").strip()
        try:
            user = await auth.authenticate(request, raw_key)
        except RateLimitError as exc:
            context = {"next": target, "error": f"{exc.message}; try again in {auth.retry_after(exc)} s."}
            response = await render(request, None, "login.html", context, status_code=429)
            response.headers["Retry-After"] = auth.retry_after(exc)
            return response
        if user is None:
            context = {"next": target, "error": "That API key is unknown or revoked."}
            return await render(request, None, "login.html", context, status_code=401)
        response = RedirectResponse(target, status_code=303)
        auth.set_key_cookie(request, response, raw_key)
        return response

    @router.get("/logout")
    @router.post("/logout")
    async def logout() -> Response:
        # Clearing a cookie needs no CSRF protection: the worst a forged request does is log out.
        response = RedirectResponse("/ui/login", status_code=303)
        auth.clear_key_cookie(response)
        return response

    # -- runs -------------------------------------------------------------------------------

    async def runs_context(request: Request, user: UiUser) -> dict[str, Any]:
        filters, problems = parse_run_filters(request.query_params)
        rt = runtime_of(request)
        page = await queries.list_runs(
            rt, user.workspace_id, filters, page=_int(request.query_params.get("page"), 1)
        )
        return {
            "nav": "runs", "page": page, "f": filters, "problems": problems,
            "query": filter_query(request.query_params),
            "definitions": await queries.definition_choices(rt, user.workspace_id),
            # STEVORA_RATE_LIMITS: current use per model (none configured: no statement).
            "rate_limits": await provider_limits.current_use(rt.pool, rt.settings) if rt.settings.rate_limits else [],
        }  # fmt: skip

    @router.get("/runs")
    async def runs_page(request: Request) -> Response:
        user = await current_user(request)
        if user is None:
            return auth.login_redirect(request)
        return await render(request, user, "runs.html", await runs_context(request, user))

    @router.get("/runs/table")
    async def runs_table(request: Request) -> Response:
        """The runs list alone, for the page's live refresh."""
        user = await current_user(request)
        if user is None:
            return PlainTextResponse("Not logged in", status_code=401)
        context = await runs_context(request, user)
        return templates.TemplateResponse(request, "_runs_list.html", context, headers=SECURITY_HEADERS)

    async def run_context(request: Request, user: UiUser, run_id: str) -> dict[str, Any] | None:
        view = await queries.run_view(runtime_of(request), user.workspace_id, run_id)
        if view is None:
            return None
        handed_over = await run_page_context(runtime_of(request), view.run)
        return {
            "nav": "runs",
            "user": user,
            "v": view,
            "run": view.run,
            "waterfall": waterfall.build(view, handed_over["awaited_calls"]),
            "event_types": ",".join(EVENT_TYPES),
            **handed_over,
            **await time_travel.run_page_context(runtime_of(request), view.run),
        }

    @router.get("/runs/{run_id}")
    async def run_page(request: Request, run_id: str) -> Response:
        user = await current_user(request)
        if user is None:
            return auth.login_redirect(request)
        context = await run_context(request, user, run_id)
        if context is None:
            return await not_found(request, user, f"Run {run_id}")
        return await render(request, user, "run.html", context)

    @router.get("/blobs/{sha256}")
    async def blob(request: Request, sha256: str) -> Response:
        """An image or file of this workspace's conversations, by content hash (the run page's
        `<img>`): never another workspace's, served so a browser cannot run it."""
        user = await current_user(request)
        if user is None:
            return PlainTextResponse("Not logged in", status_code=401)
        row = (
            await blobs.one(runtime_of(request).pool, user.workspace_id, sha256)
            if is_sha256(sha256)
            else None
        )
        if row is None:
            return PlainTextResponse("Not found", status_code=404)
        media_type, data = row
        image = media_type.startswith("image/")
        headers = {
            "Content-Security-Policy": "default-src 'none'; sandbox",
            "X-Content-Type-Options": "nosniff",
            "Cache-Control": "private, max-age=86400, immutable",
            "Content-Disposition": "inline" if image else f'attachment; filename="{sha256[:16]}.pdf"',
        }
        return Response(data, media_type=media_type, headers=headers)

    @router.get("/runs/{run_id}/fragment")
    async def run_fragment(request: Request, run_id: str) -> Response:
        user = await current_user(request)
        if user is None:
            return PlainTextResponse("Not logged in", status_code=401)
        context = await run_context(request, user, run_id)
        if context is None:
            return PlainTextResponse("Run not found", status_code=404)
        return templates.TemplateResponse(request, "_run_body.html", context, headers=SECURITY_HEADERS)

    @router.get("/runs/{run_id}/stream")
    async def run_stream(request: Request, run_id: str) -> Response:
        user = await current_user(request)
        if user is None:
            return PlainTextResponse("Not logged in", status_code=401)
        rt = runtime_of(request)
        if await queries.run_status(rt, user.workspace_id, run_id) is None:
            return PlainTextResponse("Run not found", status_code=404)
        # A reconnecting EventSource sends Last-Event-ID; the first connection passes ?after=.
        after = _int(request.headers.get("last-event-id") or request.query_params.get("after"), 0)
        return StreamingResponse(
            run_events(rt, user.workspace_id, run_id, after),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @router.post("/runs/{run_id}/tool-outputs")
    async def submit_tool_output(request: Request, run_id: str) -> Response:
        guarded = await checked_form(request)
        if isinstance(guarded, Response):
            return guarded
        user, form = guarded
        try:
            parse_answer(form)
        except ValueError as exc:
            # Refused before anything is recorded: the page again, with the text as typed (a
            # redirect would lose it) and the reason above it.
            context = await run_context(request, user, run_id)
            if context is None:
                return await not_found(request, user, f"Run {run_id}")
            context["typed"] = {form.get("tool_call_id", ""): form.get("output", "")}
            context["flash"] = auth.Flash("error", str(exc), None)
            return await render(request, user, "run.html", context, status_code=400)
        return await record_answer(runtime_of(request), user.workspace_id, run_id, form)

    # -- approvals --------------------------------------------------------------------------

    @router.get("/approvals")
    async def approvals_page(request: Request) -> Response:
        user = await current_user(request)
        if user is None:
            return auth.login_redirect(request)
        pending, decided = await queries.approvals(runtime_of(request), user.workspace_id)
        return await render(
            request, user, "approvals.html", {"nav": "approvals", "pending": pending, "decided": decided}
        )

    @router.post("/approvals/{approval_id}/decide")
    async def decide(request: Request, approval_id: str) -> Response:
        guarded = await checked_form(request)
        if isinstance(guarded, Response):
            return guarded
        user, form = guarded
        # A decision made on a run page goes back to it; otherwise to the inbox.
        back = form.get("back", "")
        back = back if back.startswith("/ui/runs/") and auth.safe_next(back) == back else "/ui/approvals"
        response = RedirectResponse(back, status_code=303)
        decision = DECISIONS.get(form.get("decision", ""))
        if decision is None:
            auth.set_flash(response, "Unknown decision.", "error")
            return response
        edited: Any = None
        if decision == "edited":
            text = form.get("content", "")
            try:
                edited = json.loads(text)
            except (ValueError, RecursionError):
                edited = text
        rt = runtime_of(request)
        try:
            await decide_approval(rt, user.workspace_id, approval_id, decision, edited, decided_by=user.actor)
        except StevoraError as exc:
            auth.set_flash(response, exc.message, "error")
            return response
        run_id = await queries.approval_run_id(rt, user.workspace_id, approval_id)
        # A rejection fails the step and the run (APPROVAL_REJECTED, never retried).
        outcome = "The run failed (APPROVAL_REJECTED)." if decision == "rejected" else "The run continues."
        # Decided on the run page, the flash lands on that page: link onward, to the approvals
        # still waiting (or nowhere), never to the page already shown.
        link: str | None = f"/ui/runs/{run_id}"
        if back.startswith("/ui/runs/"):
            link = "/ui/approvals" if await queries.pending_approval_count(rt, user.workspace_id) else None
            outcome += "" if link else " No other approval is waiting."
        auth.set_flash(response, f"{VERBS[decision]} {approval_id}. {outcome}", link=link)
        return response

    # -- definitions ------------------------------------------------------------------------

    @router.get("/definitions")
    async def definitions_page(request: Request) -> Response:
        user = await current_user(request)
        if user is None:
            return auth.login_redirect(request)
        rt = runtime_of(request)
        rows = await queries.definitions(rt, user.workspace_id)
        derived = await queries.derived_definition_count(rt, user.workspace_id)
        return await render(
            request, user, "definitions.html", {"nav": "definitions", "definitions": rows, "derived": derived}
        )

    @router.get("/mcp")
    async def mcp_page(request: Request) -> Response:
        user = await current_user(request)
        if user is None:
            return auth.login_redirect(request)
        workers, registered = await queries.mcp_servers(runtime_of(request), user.workspace_id)
        return await render(
            request, user, "mcp.html", {"nav": "mcp", "workers": workers, "registered": registered}
        )

    @router.get("/definitions/{definition_id}")
    async def definition_page(request: Request, definition_id: str) -> Response:
        user = await current_user(request)
        if user is None:
            return auth.login_redirect(request)
        context = await definition_context(request, user, definition_id)
        if context is None:
            return await not_found(request, user, f"Definition {definition_id}")
        return await render(request, user, "definition.html", context)

    # Before the run actions: their `/runs/{id}/{action}` would take `/runs/{id}/fork`.
    time_travel.add_time_travel_routes(router, render)
    add_trigger_routes(router, render)
    add_thread_routes(router, render)
    add_action_routes(router, render)
    return router
