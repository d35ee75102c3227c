"""The memory store's documents (docs/threads.md, "Memory store")."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from stevora.api.schemas.envelope import ApiIn, ApiOut, Stored, Timestamp


class StorePut(ApiIn):
    value: dict[str, Any] = Field(description="A JSON object (at most 64 KB).", examples=[{"likes": "tea"}])


class StoreItemOut(ApiOut):
    namespace: list[str] = Field(examples=[["users", "u_42"]])
    key: str
    value: Annotated[dict[str, Any], Stored]
    created_at: Timestamp | None = None
    updated_at: Timestamp | None = None
    score: float | None = Field(default=None, description="A search's rank (higher is better).")
