"""Webhooks and their delivery log."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field

from stevora.api.schemas.envelope import ApiIn, ApiOut, Timestamp
from stevora.events import WebhookEvent
from stevora.webhooks.address import InvalidUrl, parse_webhook_url

DeliveryStatus = Literal["PENDING", "DELIVERED", "FAILED"]


def _http_url(value: str) -> str:
    try:
        parse_webhook_url(value)
    except InvalidUrl as exc:
        raise ValueError(str(exc)) from None
    return value


HttpUrlStr = Annotated[
    str, Field(min_length=1, max_length=2000, json_schema_extra={"format": "uri"}), AfterValidator(_http_url)
]


def _dedupe(events: list[str]) -> list[str]:
    return list(dict.fromkeys(events))


class WebhookCreate(ApiIn):
    url: HttpUrlStr = Field(examples=["https://example.com/hooks/stevora"])
    events: Annotated[list[WebhookEvent], Field(min_length=1), AfterValidator(_dedupe)]


class WebhookOut(ApiOut):
    id: str = Field(examples=["wh_abc123"])
    workspace_id: str
    url: str
    events: list[WebhookEvent]
    is_active: bool
    created_at: Timestamp
    updated_at: Timestamp


class WebhookCreated(WebhookOut):
    secret: str = Field(
        description="Signing secret. Shown only in this response.", examples=["whsec_" + "x" * 32]
    )


class AttemptOut(ApiOut):
    attempt: int
    at: str
    status_code: int | None
    error: str | None
    duration_ms: float


class DeliveryOut(ApiOut):
    id: str
    webhook_id: str
    event: WebhookEvent
    payload: dict[str, Any]
    status: DeliveryStatus
    attempts: int
    next_attempt_at: Timestamp | None
    last_status_code: int | None
    last_error: str | None
    attempt_log: list[AttemptOut]
    delivered_at: Timestamp | None
    created_at: Timestamp
    updated_at: Timestamp
