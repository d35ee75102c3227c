"""The worker's MCP servers, in the `mcpServers` file format MCP clients share:

    {"mcpServers": {"files": {"command": "npx", "args": ["-y", "..."], "env": {"K": "v"},
                              "timeoutMs": 30000},
                    "search": {"url": "https://mcp.example.com/mcp", "headers": {"Authorization": "..."}}}}

A server with `command` is started by the worker over stdio (so only the operator declares those:
`stevora worker --mcp-config FILE`, `STEVORA_MCP_CONFIG`); one with `url` is reached over
streamable HTTP. Unknown keys are ignored, as other clients ignore them (`disabled`, `type`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from stevora.mcp.naming import SERVER_NAME_RULE, valid_server_name

DEFAULT_TIMEOUT_MS = 30_000


class McpConfigError(ValueError):
    """The `mcpServers` file cannot be used; the message names the file and the field."""


class McpServerConfig(BaseModel):
    """One server: a stdio command, or a streamable HTTP URL."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True)

    name: str = ""
    command: str | None = Field(default=None, min_length=1)
    args: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    url: str | None = Field(default=None, min_length=1)
    headers: dict[str, str] = Field(default_factory=dict)
    timeout_ms: int = Field(default=DEFAULT_TIMEOUT_MS, ge=1, le=3_600_000, alias="timeoutMs")

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError('give either "command" (a stdio server) or "url" (a streamable HTTP server)')
        return self

    @property
    def transport(self) -> Literal["stdio", "http"]:
        return "stdio" if self.command is not None else "http"

    def __hash__(self) -> int:  # frozen, but dict fields are not hashable by default
        return hash((self.name, self.command, self.args, self.url))


def parse_mcp_config(document: Any, *, source: str = "mcp config") -> dict[str, McpServerConfig]:
    """The servers of an `{"mcpServers": {...}}` document, by name."""
    if not isinstance(document, dict) or not isinstance(document.get("mcpServers"), dict):
        raise McpConfigError(f'{source}: expected an object with an "mcpServers" object')
    servers: dict[str, McpServerConfig] = {}
    for name, body in document["mcpServers"].items():
        if not valid_server_name(name):
            raise McpConfigError(f"{source}: mcpServers.{name}: server names must be {SERVER_NAME_RULE}")
        if not isinstance(body, dict):
            raise McpConfigError(f"{source}: mcpServers.{name}: expected an object")
        try:
            servers[name] = McpServerConfig.model_validate({**body, "name": name})
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            field = f"mcpServers.{name}" + (f".{where}" if where else "")
            raise McpConfigError(f"{source}: {field}: {first['msg']}") from None
    return servers


def load_mcp_config(path: str | Path) -> dict[str, McpServerConfig]:
    """Read and parse an `mcpServers` file (JSON)."""
    file = Path(path)
    try:
        document = json.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise McpConfigError(f"{file}: cannot read the MCP config: {exc.strerror}") from None
    except ValueError as exc:
        raise McpConfigError(f"{file}: not valid JSON: {exc}") from None
    return parse_mcp_config(document, source=str(file))
