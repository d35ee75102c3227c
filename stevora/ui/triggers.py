"""The UI's schedules and events pages (docs/ui.md, docs/triggers.md): next fire times, the runs
each tick and event started, and the pause / resume / trigger-now forms."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from stevora.clock import utcnow
from stevora.db import schedules as schedule_rows
from stevora.db import trigger_events as event_rows
from stevora.errors import StevoraError
from stevora.triggers import schedule_store, schedules
from stevora.ui import auth
from stevora.ui.actions import Render
from stevora.ui.auth import current_user, runtime_of
from stevora.ui.forms import checked_form

PAGE_SIZE = 100


def add_trigger_routes(router: APIRouter, render: Render) -> None:
    """Register the schedules and events pages and the schedule actions on the UI router."""

    @router.get("/schedules")
    async def schedules_page(request: Request) -> Response:
        user = await current_user(request)
        if user is None:
            return auth.login_redirect(request)
        rt = runtime_of(request)
        found, _ = await schedule_rows.list_schedules(rt.pool, user.workspace_id, 0, PAGE_SIZE)
        now = utcnow()
        rows: list[dict[str, Any]] = [
            {
                **dict(r),
                "next_fire_times": schedules.upcoming(r, now, 3),
                "last_runs": await schedule_rows.last_runs(rt.pool, r["id"], 3),
            }
            for r in found
        ]
        return await render(request, user, "schedules.html", {"nav": "schedules", "schedules": rows}, 200)

    @router.post("/schedules/{schedule_id}/{action}")
    async def schedule_action(request: Request, schedule_id: str, action: str) -> Response:
        guarded = await checked_form(request)
        if isinstance(guarded, Response):
            return guarded
        user, _ = guarded
        rt = runtime_of(request)
        response = RedirectResponse("/ui/schedules", status_code=303)
        try:
            if action in ("pause", "resume"):
                await schedule_store.update(rt, user.workspace_id, schedule_id, {"paused": action == "pause"})
                auth.set_flash(
                    response, "Paused the schedule." if action == "pause" else "Resumed the schedule."
                )
            elif action == "trigger":
                row = await schedule_store.get(rt, user.workspace_id, schedule_id)
                run_id, _ = await schedules.trigger_now(rt, row)
                auth.set_flash(response, f"Started run {run_id}.", link=f"/ui/runs/{run_id}")
            else:
                auth.set_flash(response, f"Unknown action '{action}'.", "error")
        except StevoraError as exc:
            auth.set_flash(response, f"{exc.code}: {exc.message}", "error")
        return response

    @router.get("/events")
    async def events_page(request: Request) -> Response:
        user = await current_user(request)
        if user is None:
            return auth.login_redirect(request)
        rt = runtime_of(request)
        found, total = await event_rows.list_events(rt.pool, user.workspace_id, None, 0, PAGE_SIZE)
        runs = await event_rows.runs_of_events(rt.pool, [r["id"] for r in found])
        context = {"nav": "events", "events": found, "runs": runs, "total": total}
        return await render(request, user, "events.html", context, 200)
