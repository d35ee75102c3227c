"""`/v1/webhooks`: subscribe a URL to run and approval events; list; delete; delivery log.

Delivery (signing, retries) is `stevora.webhooks.delivery`; the engine writes one outbox row per
subscribed webhook in the same transaction as the change it announces.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from starlette.responses import Response

from stevora.api.deps import Auth, Ctx, Paging
from stevora.api.openapi import errors
from stevora.api.schemas.envelope import Envelope, Page, ok, page
from stevora.api.schemas.webhooks import (
    DeliveryOut,
    DeliveryStatus,
    WebhookCreate,
    WebhookCreated,
    WebhookOut,
)
from stevora.db.reads import webhooks as webhook_reads
from stevora.errors import ConflictError, NotFoundError, ValidationError
from stevora.ids import random_token
from stevora.webhooks.address import BlockedUrl, UnresolvedHost, check_webhook_url

router = APIRouter(prefix="/webhooks", tags=["webhooks"])
WebhookId = Annotated[str, Path(description="A webhook id (wh_...).")]
SECRET_PREFIX = "whsec_"


@router.post(
    "",
    status_code=201,
    response_model=Envelope[WebhookCreated],
    responses=errors(400, 409),
    summary="Create a webhook",
)
async def create_webhook(body: WebhookCreate, auth: Auth, ctx: Ctx) -> Response:
    """The signing `secret` is in this response only. URLs that resolve to private, loopback or
    link-local addresses are refused (400, `url`) unless STEVORA_WEBHOOK_ALLOW_PRIVATE is set. A
    workspace has at most STEVORA_WEBHOOKS_PER_WORKSPACE webhooks (default 25; 409 past it)."""
    try:
        await check_webhook_url(body.url, allow_private=ctx.settings.webhook_allow_private)
    except BlockedUrl as exc:
        raise ValidationError.from_problems([{"path": "url", "message": str(exc)}]) from None
    except UnresolvedHost:
        pass  # accepted: delivery resolves again (and refuses a private answer then)
    limit = ctx.settings.webhooks_per_workspace
    secret = SECRET_PREFIX + random_token(32)
    row, count = await webhook_reads.insert_within_limit(
        ctx.rt.pool, auth.workspace_id, body.url, list(body.events), secret, limit
    )
    if row is None:
        raise ConflictError(
            f"The workspace has {count} webhooks, its limit (STEVORA_WEBHOOKS_PER_WORKSPACE={limit}); "
            "delete one or subscribe an existing one to more events",
            details={"limit": limit, "webhooks": count},
        )
    return ok(WebhookCreated.model_validate(row), 201)


@router.get("", response_model=Envelope[list[WebhookOut]], summary="List webhooks")
async def list_webhooks(auth: Auth, ctx: Ctx) -> Response:
    rows = await webhook_reads.of_workspace(ctx.rt.pool, auth.workspace_id)
    return ok([WebhookOut.model_validate(r) for r in rows])


@router.delete("/{webhook_id}", response_model=Envelope[WebhookOut], responses=errors(404), summary="Delete")
async def delete_webhook(webhook_id: WebhookId, auth: Auth, ctx: Ctx) -> Response:
    """Deletes the webhook and its delivery log; pending deliveries are not sent."""
    row = await webhook_reads.delete(ctx.rt.pool, auth.workspace_id, webhook_id)
    if row is None:
        raise NotFoundError("Webhook not found", details={"webhookId": webhook_id})
    return ok(WebhookOut.model_validate(row))


@router.get(
    "/{webhook_id}/deliveries",
    response_model=Page[DeliveryOut],
    responses=errors(404),
    summary="A webhook's deliveries and their attempts",
)
async def list_deliveries(
    webhook_id: WebhookId,
    auth: Auth,
    ctx: Ctx,
    paging: Paging,
    status: Annotated[DeliveryStatus | None, Query(description="Only deliveries in this status.")] = None,
) -> Response:
    """Newest first; each with its `attemptLog` ({attempt, at, statusCode, error, durationMs})."""
    if not await webhook_reads.exists(ctx.rt.pool, auth.workspace_id, webhook_id):
        raise NotFoundError("Webhook not found", details={"webhookId": webhook_id})
    total = await webhook_reads.delivery_count(ctx.rt.pool, webhook_id, status)
    rows = []
    if paging.offset < total:  # the page query is skipped past the end
        rows = await webhook_reads.deliveries(
            ctx.rt.pool, webhook_id, status, offset=paging.offset, limit=paging.page_size
        )
    data = [DeliveryOut.model_validate(r) for r in rows]
    return page(data, page=paging.page, page_size=paging.page_size, total=total)
