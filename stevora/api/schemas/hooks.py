"""Inbound webhooks (docs/api/hooks.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from stevora.api.schemas.envelope import ApiIn, ApiOut, Timestamp


class HookCreate(ApiIn):
    provider: Literal["github", "stripe", "hmac"]
    event: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="The event name deliveries become; default github.<X-GitHub-Event> or stripe.<type>.",
    )

    @model_validator(mode="after")
    def _generic_needs_event(self) -> HookCreate:
        if self.provider == "hmac" and self.event is None:
            raise ValueError("event: required for provider hmac")
        return self


class HookOut(ApiOut):
    id: str = Field(examples=["hook_abc123"])
    provider: str
    event: str | None
    url: str = Field(description="Where the third party posts (unauthenticated; signed).")
    created_at: Timestamp


class HookCreated(HookOut):
    secret: str = Field(
        description="The signing secret to give the third party. Shown only in this response."
    )
