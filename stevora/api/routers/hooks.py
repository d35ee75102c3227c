"""`/v1/hooks` (create, list, delete inbound webhook endpoints) and `/hooks/{id}`, where a third
party posts: unauthenticated, but signed with the hook's secret (docs/triggers.md)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from starlette.responses import Response

from stevora.api.deps import Auth, Ctx
from stevora.api.openapi import errors
from stevora.api.routers.trigger_events import event_answer
from stevora.api.schemas.envelope import Envelope, error_response, ok
from stevora.api.schemas.hooks import HookCreate, HookCreated, HookOut
from stevora.api.schemas.trigger_events import EventOut
from stevora.db import inbound_hooks as rows
from stevora.engine import limits
from stevora.errors import NotFoundError, StevoraError
from stevora.ids import random_token
from stevora.triggers import hooks
from stevora.triggers.events import IncomingEvent, receive

router = APIRouter(prefix="/hooks", tags=["triggers"])
inbound_router = APIRouter(tags=["triggers"])
HookId = Annotated[str, Path(max_length=40, description="A hook id (hook_...).")]


def _out(row: Any) -> dict[str, Any]:
    return {**dict(row), "url": f"/hooks/{row['id']}"}


@router.post(
    "", status_code=201, response_model=Envelope[HookCreated], responses=errors(400), summary="Create"
)
async def create_hook(body: HookCreate, auth: Auth, ctx: Ctx) -> Response:
    """The `secret` is in this response only; give it to the third party as its signing secret."""
    secret = "hksec_" + random_token(32)
    row = await rows.insert_hook(ctx.rt.pool, auth.workspace_id, body.provider, body.event, secret)
    return ok(HookCreated.model_validate({**_out(row), "secret": secret}), 201)


@router.get("", response_model=Envelope[list[HookOut]], summary="List inbound hooks")
async def list_hooks(auth: Auth, ctx: Ctx) -> Response:
    return ok(
        [HookOut.model_validate(_out(r)) for r in await rows.list_hooks(ctx.rt.pool, auth.workspace_id)]
    )


@router.delete("/{hook_id}", response_model=Envelope[HookOut], responses=errors(404), summary="Delete")
async def delete_hook(hook_id: HookId, auth: Auth, ctx: Ctx) -> Response:
    row = await rows.delete_hook(ctx.rt.pool, auth.workspace_id, hook_id)
    if row is None:
        raise NotFoundError("Hook not found", details={"hookId": hook_id})
    return ok(HookOut.model_validate(_out(row)))


async def _body_within(request: Request, limit: int) -> bytes | None:
    """The body, or None past `limit` bytes (read no further)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


@inbound_router.post(
    "/hooks/{hook_id}",
    response_model=Envelope[EventOut],
    responses=errors(400, 401, 404),
    summary="Receive a third party's webhook (signed; no API key)",
)
async def receive_hook(hook_id: HookId, request: Request, ctx: Ctx) -> Response:
    """A verified delivery becomes an event (200 with the runs it started); a replayed delivery id
    is a 200 that starts nothing; a bad signature is a 401 and nothing is stored."""
    hook = await rows.hook_with_secret(ctx.rt.pool, hook_id)
    if hook is None:
        raise NotFoundError("Hook not found", details={"hookId": hook_id})
    body = await _body_within(request, ctx.settings.max_hook_body_bytes)
    if body is None:
        return error_response(
            413, "PAYLOAD_TOO_LARGE", f"A hook body is at most {ctx.settings.max_hook_body_bytes} bytes"
        )
    headers = {k.lower(): v for k, v in request.headers.items()}
    try:
        delivery = hooks.read_delivery(hook["provider"], hook["secret"], hook["event"], body, headers)
    except hooks.BadSignature as exc:
        return error_response(401, "AUTH_ERROR", f"Invalid webhook signature: {exc}")
    except hooks.BadPayload as exc:
        return error_response(400, "VALIDATION_ERROR", str(exc))
    try:
        limits.check_sized(
            ctx.settings,
            delivery.data,
            "body",
            ctx.settings.max_signal_payload_bytes,
            "STEVORA_MAX_SIGNAL_PAYLOAD_BYTES",
        )
    except StevoraError as exc:
        return error_response(exc.http_status, exc.code, exc.message, exc.details)
    event = IncomingEvent(delivery.event_name, delivery.data, f"hook:{hook_id}:{delivery.delivery_id}")
    (received,) = await receive(ctx.rt, hook["workspace_id"], [event], source=f"hook:{hook_id}")
    return ok(event_answer(received))
