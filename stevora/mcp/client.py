"""This process's connections to MCP servers, one per server, shared by every run.

A stdio server is started on its first use (`stdio_client` + `ClientSession` of the `mcp` SDK),
shared by the process's runs, and closed at shutdown. A server that exits or stops answering
fails the calls in flight with `McpUnavailable` (the loop records them as `MCP_SERVER_UNAVAILABLE`
and the model reads the error); the next call starts it again, at once after a first crash and
then with exponential backoff while it keeps failing, so a broken server costs each call an
immediate error rather than a wait. A streamable HTTP server is one pooled session, initialised
again when the server drops it.

The SDK's sessions are anyio context managers that must be left by the task that entered them,
so each connection is owned by one supervisor task that enters them, reports the session ready,
and leaves them when told to stop; callers only send requests on the ready session.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

import httpx2
import structlog
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, CallToolResult, Implementation, RequestParamsMeta, Tool

from stevora.mcp.config import McpServerConfig

log = structlog.get_logger("stevora.mcp")

CLIENT_INFO = Implementation(name="stevora", version="0.1.0")
FIRST_BACKOFF_S = 0.25
MAX_BACKOFF_S = 30.0
START_TIMEOUT_S = 30.0

ProgressFn = ProgressFnT  # async (progress, total, message) -> None


class McpUnavailable(Exception):
    """The server could not be reached, died during the call, or is waiting to be restarted."""


@dataclass(frozen=True)
class ListedTools:
    """What a server listed to this client: its tools and who it said it was at initialize."""

    tools: tuple[Tool, ...]
    server_name: str
    server_version: str


@dataclass
class ServerHealth:
    """What `stevora mcp list`, the UI and /metrics show of one server in this process."""

    state: str = "idle"  # idle (not started yet), up, down (restarting), closed
    restarts: int = 0
    last_error: str | None = None
    server_name: str | None = None
    server_version: str | None = None


class McpConnection:
    """One server's session: started lazily, restarted after a crash with backoff."""

    def __init__(
        self,
        config: McpServerConfig,
        *,
        errlog: Any = None,
        on_restart: Callable[[str], None] | None = None,
        url_guard: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        self.config = config
        self._url_guard = url_guard
        self._on_restart = on_restart
        self.health = ServerHealth()
        self._errlog = errlog if errlog is not None else sys.stderr
        self._lock = asyncio.Lock()
        self._session: ClientSession | None = None
        self._server_info: Implementation | None = None
        self._stop: asyncio.Event | None = None
        self._owner: asyncio.Task[None] | None = None
        self._failures = 0  # consecutive failed starts or crashes
        self._not_before = 0.0  # monotonic time the next start may happen
        self._started_once = False
        self._closing: set[asyncio.Task[None]] = set()  # owners of dropped sessions, still cleaning up

    async def _ready(self) -> ClientSession:
        session = self._session
        if session is not None:
            return session
        async with self._lock:
            if self._session is not None:
                return self._session
            wait_s = self._not_before - time.monotonic()
            if wait_s > 0:
                raise McpUnavailable(
                    f"MCP server '{self.config.name}' is down ({self.health.last_error}); "
                    f"next restart in {wait_s:.1f}s"
                )
            try:
                async with asyncio.timeout(START_TIMEOUT_S):
                    await self._start()
            except (Exception, TimeoutError) as exc:
                self._failed(f"cannot start: {_describe(exc)}")
                raise McpUnavailable(
                    f"MCP server '{self.config.name}' cannot be started: {_describe(exc)}"
                ) from exc
            assert self._session is not None
            return self._session

    async def _start(self) -> None:
        if self._url_guard is not None and self.config.url is not None:
            await self._url_guard(self.config.url)  # raises: the session is not opened
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[tuple[ClientSession, Implementation]] = loop.create_future()
        stop = asyncio.Event()
        owner = asyncio.create_task(self._own(ready, stop), name=f"mcp:{self.config.name}")
        try:
            session, info = await asyncio.shield(ready)
        except BaseException:
            stop.set()
            owner.cancel()
            with contextlib.suppress(BaseException):
                await owner
            raise
        if self._started_once:
            self.health.restarts += 1
            if self._on_restart is not None:
                self._on_restart(self.config.name)
        self._started_once = True
        self._session, self._server_info, self._stop, self._owner = session, info, stop, owner
        self.health.state = "up"
        self.health.server_name, self.health.server_version = info.name, info.version
        log.info("mcp_server_started", server=self.config.name, transport=self.config.transport)

    async def _own(
        self, ready: asyncio.Future[tuple[ClientSession, Implementation]], stop: asyncio.Event
    ) -> None:
        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(self._transport(stack))
                session = await stack.enter_async_context(ClientSession(read, write, client_info=CLIENT_INFO))
                init = await session.initialize()
                ready.set_result((session, init.server_info))
                await stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else McpUnavailable(_describe(exc)))
            if not isinstance(exc, Exception):
                raise

    def _transport(self, stack: contextlib.AsyncExitStack) -> Any:
        config = self.config
        if config.command is not None:
            params = StdioServerParameters(
                command=config.command, args=list(config.args), env=dict(config.env) or None, cwd=config.cwd
            )
            return stdio_client(params, errlog=self._errlog)
        assert config.url is not None
        client = httpx2.AsyncClient(headers=dict(config.headers), timeout=httpx2.Timeout(30.0, read=300.0))
        stack.push_async_callback(client.aclose)
        return streamable_http_client(config.url, http_client=client)

    def _failed(self, reason: str) -> None:
        self._failures += 1
        delay = (
            0.0 if self._failures <= 1 else min(FIRST_BACKOFF_S * 2 ** (self._failures - 2), MAX_BACKOFF_S)
        )
        self._not_before = time.monotonic() + delay
        self.health.state = "down"
        self.health.last_error = reason
        log.warning("mcp_server_down", server=self.config.name, reason=reason, restart_in_s=delay)

    async def _drop(self, session: ClientSession, reason: str) -> None:
        """Forget a dead session (once, whoever noticed first) and let its owner clean up."""
        if self._session is not session:
            return
        stop, owner = self._stop, self._owner
        self._session = self._stop = self._owner = None
        self._failed(reason)
        if stop is not None:
            stop.set()
        if owner is not None:
            # The owner closes the dead transport in the background (the SDK waits for the process
            # to exit): the next call starts a new session at once instead of waiting for that.
            self._closing.add(owner)
            owner.add_done_callback(self._closing.discard)

    async def list_tools(self) -> ListedTools:
        session = await self._ready()
        tools: list[Tool] = []
        cursor: str | None = None
        try:
            while True:
                from mcp_types import PaginatedRequestParams

                page = await session.list_tools(
                    params=PaginatedRequestParams(cursor=cursor) if cursor else None
                )
                tools.extend(page.tools)
                cursor = page.next_cursor
                if not cursor:
                    break
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                await self._drop(session, exc.message)
                raise McpUnavailable(f"MCP server '{self.config.name}' closed the connection") from exc
            raise
        except (OSError, httpx2.HTTPError) as exc:
            await self._drop(session, _describe(exc))
            raise McpUnavailable(f"MCP server '{self.config.name}' is unreachable: {_describe(exc)}") from exc
        info = self._server_info
        return ListedTools(tuple(tools), info.name if info else "", info.version if info else "")

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any],
        *,
        idempotency_key: str,
        timeout_s: float,
        progress: ProgressFn | None = None,
    ) -> CallToolResult:
        """One `tools/call`; raises `McpUnavailable` when the server is gone, `TimeoutError` past
        `timeout_s`, `MCPError` for a protocol error the server answered with."""
        session = await self._ready()
        try:
            async with asyncio.timeout(timeout_s):
                result = await session.call_tool(
                    name,
                    arguments,
                    progress_callback=progress,
                    meta=cast(RequestParamsMeta, {"idempotencyKey": idempotency_key}),
                )
        except TimeoutError:  # an OSError: the call took too long, the session is still good
            raise
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                await self._drop(session, exc.message)
                raise McpUnavailable(
                    f"MCP server '{self.config.name}' closed the connection during the call"
                ) from exc
            raise
        except (OSError, httpx2.HTTPError) as exc:
            await self._drop(session, _describe(exc))
            raise McpUnavailable(f"MCP server '{self.config.name}' is unreachable: {_describe(exc)}") from exc
        self._failures = 0
        return result

    async def close(self) -> None:
        async with self._lock:
            stop, owner = self._stop, self._owner
            self._session = self._stop = self._owner = None
            self.health.state = "closed"
            if stop is not None:
                stop.set()
            if owner is not None:
                try:
                    async with asyncio.timeout(10.0):
                        await owner
                except BaseException:  # a server that will not exit is killed by the SDK's transport
                    owner.cancel()
            for closing in list(self._closing):
                closing.cancel()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return _describe(exc.exceptions[0])
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
