"""Events that start runs (docs/api/events.md)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AwareDatetime, Field

from stevora.api.schemas.envelope import ApiIn, ApiOut, Stored, Timestamp


class EventIn(ApiIn):
    name: str = Field(min_length=1, max_length=200, examples=["order.paid"])
    data: dict[str, Any] = Field(default_factory=dict, examples=[{"orderId": "o_1", "amount": 120}])
    id: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="Deduplication key: a later event with the same id is the same event.",
    )
    ts: AwareDatetime | None = Field(default=None, description="When it happened (default: received).")


class EventRun(ApiOut):
    run_id: str
    kind: str = Field(description="started (a trigger's run) or resumed (a waiting step it answered)")
    status: str | None
    definition_id: str | None


class EventOut(ApiOut):
    id: str = Field(description="The event's id (given, or generated).", examples=["tev_abc123"])
    name: str
    data: Annotated[Any, Stored]
    ts: Timestamp
    source: str = Field(description="api, or hook:<hook id>")
    received_at: Timestamp
    deduplicated: bool = Field(default=False, description="True when this id had been received before.")
    runs: list[EventRun]
