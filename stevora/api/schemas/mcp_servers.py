"""MCP servers: a workspace's streamable HTTP servers, and the workers' own (docs/mcp.md)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from stevora.api.schemas.envelope import ApiIn, ApiOut, Timestamp
from stevora.api.schemas.webhooks import HttpUrlStr

ServerName = Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_-]{0,31}$", examples=["search"])]
HeaderName = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")]


class McpServerCreate(ApiIn):
    name: ServerName
    url: HttpUrlStr = Field(examples=["https://mcp.example.com/mcp"])
    headers: dict[HeaderName, Annotated[str, Field(max_length=8000, pattern=r"^[^\r\n\x00]*$")]] = Field(
        default_factory=dict,
        max_length=50,
        description="Sent with every request to the server (e.g. Authorization). Secrets: never returned.",
    )
    timeout_ms: int = Field(default=30_000, ge=1, le=3_600_000, description="Bound of each tool call.")


class McpServerOut(ApiOut):
    id: str = Field(examples=["mcps_abc123"])
    name: str
    url: str
    header_names: list[str] = Field(
        description="The names of the stored headers; their values are never returned."
    )
    timeout_ms: int
    created_at: Timestamp


class WorkerMcpServerOut(ApiOut):
    """A server from a worker's mcpServers file, as that worker last published it."""

    worker_id: str
    name: str
    transport: Literal["stdio", "http"]
    state: str = Field(description="idle (not started yet), up, down (restarting) or closed")
    restarts: int
    last_error: str | None
    server_version: str | None
    updated_at: Timestamp


class McpServersOut(ApiOut):
    registered: list[McpServerOut]
    workers: list[WorkerMcpServerOut]
