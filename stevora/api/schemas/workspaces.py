"""Workspaces and API keys."""

from __future__ import annotations

from pydantic import Field

from stevora.api.schemas.envelope import ApiIn, ApiOut, Timestamp

SLUG_PATTERN = r"^[a-z0-9-]+$"


class WorkspaceCreate(ApiIn):
    name: str = Field(min_length=1, max_length=100, examples=["Acme Corp"])
    slug: str = Field(min_length=1, max_length=50, pattern=SLUG_PATTERN, examples=["acme-corp"])


class WorkspaceOut(ApiOut):
    id: str = Field(examples=["ws_xyz789"])
    name: str
    slug: str
    created_at: Timestamp
    updated_at: Timestamp


class ApiKeyCreate(ApiIn):
    name: str = Field(min_length=1, max_length=100, examples=["Production"])
    workspace_id: str | None = Field(
        default=None,
        max_length=40,
        description="Only without x-api-key: the workspace for the key (admin token or first-key bootstrap).",
    )


class ApiKeyOut(ApiOut):
    id: str = Field(examples=["key_abc123"])
    workspace_id: str
    name: str
    key_prefix: str = Field(
        description="The first characters of the key, to recognise it.", examples=["stv_a1b2"]
    )
    last_used_at: Timestamp | None
    created_at: Timestamp
    revoked_at: Timestamp | None


class ApiKeyCreated(ApiOut):
    id: str
    workspace_id: str
    name: str
    key: str = Field(
        description="The raw key. Shown only in this response.", examples=["stv_" + "a1b2c3d4" * 4]
    )
    key_prefix: str
    created_at: Timestamp
