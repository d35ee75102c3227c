"""The per-process MCP client manager: the worker's own servers (its `mcpServers` file) and the
workspaces' streamable HTTP servers (registered through the API), one pooled connection each."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from stevora.mcp.client import McpConnection, ServerHealth
from stevora.mcp.config import McpServerConfig


class McpClientManager:
    """Connections by server; a workspace's HTTP server is pooled under its workspace, so one
    workspace's server never serves another."""

    def __init__(
        self,
        servers: dict[str, McpServerConfig] | None = None,
        *,
        errlog: Any = None,
        on_restart: Callable[[str], None] | None = None,
    ) -> None:
        self.servers = dict(servers or {})
        self._errlog = errlog
        self._on_restart = on_restart
        self._own = {
            name: McpConnection(config, errlog=errlog, on_restart=on_restart)
            for name, config in self.servers.items()
        }
        # (workspace id, name) → the connection and the registration it was opened for: a
        # registration replaced under the same name (new URL or headers) gets a new session.
        self._registered: dict[tuple[str, str], McpConnection] = {}
        # Checks a registered server's URL before each session is opened (the worker edge sets the
        # private-address guard of webhooks here unless STEVORA_MCP_ALLOW_PRIVATE; docs/mcp.md).
        self.url_guard: Callable[[str], Awaitable[None]] | None = None
        self._closing: set[asyncio.Task[None]] = set()

    def connection(
        self, name: str, *, workspace_id: str | None = None, registered: McpServerConfig | None = None
    ) -> McpConnection | None:
        """The worker's own server of that name, else the workspace's registered one (if given)."""
        own = self._own.get(name)
        if own is not None:
            return own
        if registered is None or workspace_id is None:
            return None
        key = (workspace_id, name)
        found = self._registered.get(key)
        if found is not None and found.config == registered:
            return found
        if found is not None:  # replaced: the old session closes in the background
            closing = asyncio.get_running_loop().create_task(found.close())
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)
        # No `on_restart`: metrics are never labelled by a (tenant-chosen) registered name.
        found = self._registered[key] = McpConnection(
            registered, errlog=self._errlog, url_guard=self.url_guard
        )
        return found

    def health(self) -> dict[str, ServerHealth]:
        """The worker's own servers' health, by name."""
        return {name: conn.health for name, conn in self._own.items()}

    async def close(self) -> None:
        """Close every session (stdio servers exit); called at worker shutdown."""
        connections = [*self._own.values(), *self._registered.values()]
        self._registered.clear()
        await asyncio.gather(*(conn.close() for conn in connections), return_exceptions=True)
