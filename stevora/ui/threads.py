"""The UI's chat page (docs/ui.md, docs/threads.md): a thread as bubbles, each turn's run one click
away, a send box with the double-texting choice while a turn works, live tokens over the run
page's own stream; and "New chat" on a definition."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from stevora.db.reads import threads as thread_reads
from stevora.engine import threads
from stevora.errors import StevoraError
from stevora.ui import auth
from stevora.ui.actions import Render
from stevora.ui.auth import current_user, runtime_of
from stevora.ui.forms import checked_form

POLICIES = ("enqueue", "steer", "interrupt", "reject")


def add_thread_routes(router: APIRouter, render: Render) -> None:
    """Register the chat page, its send form and "New chat" on the UI router."""

    @router.get("/threads/{thread_id}")
    async def chat_page(request: Request, thread_id: str) -> Response:
        user = await current_user(request)
        if user is None:
            return auth.login_redirect(request)
        rt = runtime_of(request)
        thread = await thread_reads.get(rt.pool, user.workspace_id, thread_id)
        if thread is None:
            return await render(
                request, user, "not_found.html", {"what": f"Thread {thread_id}", "nav": None}, 404
            )
        turns = await thread_reads.turns(rt.pool, thread.id)
        open_turns = [t.id for t in turns if t.status in ("PENDING", "RUNNING", "WAITING", "PAUSED")]
        context = {
            "nav": "definitions",
            "thread": thread,
            "messages": await threads.conversation(rt, thread),
            "turns": {t.id: t for t in turns},
            "active_run_id": open_turns[0] if open_turns else None,
            "queued": open_turns[1:],
            "policies": POLICIES,
        }
        return await render(request, user, "chat.html", context, 200)

    @router.post("/threads/{thread_id}/messages")
    async def send(request: Request, thread_id: str) -> Response:
        guarded = await checked_form(request)
        if isinstance(guarded, Response):
            return guarded
        user, form = guarded
        response = RedirectResponse(f"/ui/threads/{thread_id}", status_code=303)
        content = form.get("content", "").strip()
        policy = form.get("on_active") or None
        if not content:
            auth.set_flash(response, "Write a message first.", "error")
            return response
        if policy is not None and policy not in POLICIES:
            auth.set_flash(response, f"Unknown choice '{policy}'.", "error")
            return response
        try:
            sent = await threads.send(
                runtime_of(request), user.workspace_id, thread_id, content[:32_000], policy
            )
        except StevoraError as exc:
            auth.set_flash(response, f"{exc.code}: {exc.message}", "error")
            return response
        if sent.policy == "steer":
            auth.set_flash(response, "Sent into the running turn: it goes in at its next round.")
        elif sent.policy == "enqueue" and sent.queued:
            auth.set_flash(response, "Queued: it starts when the turns before it end.")
        elif sent.policy == "interrupt":
            auth.set_flash(response, f"Interrupted run {sent.interrupted_run_id}.")
        return response

    @router.post("/definitions/{definition_id}/chat")
    async def new_chat(request: Request, definition_id: str) -> Response:
        guarded = await checked_form(request)
        if isinstance(guarded, Response):
            return guarded
        user, _ = guarded
        try:
            thread = await threads.create_thread(
                runtime_of(request),
                user.workspace_id,
                definition_id,
                metadata={},
                state={},
                on_active="enqueue",
            )
        except StevoraError as exc:
            response = RedirectResponse(f"/ui/definitions/{definition_id}", status_code=303)
            auth.set_flash(response, f"{exc.code}: {exc.message}", "error")
            return response
        return RedirectResponse(f"/ui/threads/{thread.id}", status_code=303)
