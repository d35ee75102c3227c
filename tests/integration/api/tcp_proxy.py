"""A TCP proxy in the test's event loop: put it between a Runtime and PostgreSQL, then `stop()` it
to make the database unreachable (connections dropped, new ones refused) without touching the
machine's PostgreSQL service, and `start()` it again on the same port.

The upstream is whatever the database URL names: a TCP host and port, or (libpq's `?host=/dir`
form, which the suite's embedded PostgreSQL uses) the Unix socket `/dir/.s.PGSQL.<port>`."""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        """`target_host` starting with "/" is a Unix socket's path (`target_port` is then unused)."""
        self.target = (target_host, target_port)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Refuse new connections and cut every open one (what a PostgreSQL crash looks like)."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()
        await asyncio.sleep(0.05)

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            if self.target[0].startswith("/"):
                server_r, server_w = await asyncio.open_unix_connection(self.target[0])
            else:
                server_r, server_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.transport.abort()
            return
        self._writers |= {client_w, server_w}

        async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while data := await reader.read(65536):
                    writer.write(data)
                    await writer.drain()
            writer.transport.abort()

        await asyncio.gather(pipe(client_r, server_w), pipe(server_r, client_w))
        self._writers -= {client_w, server_w}


def proxy_for_database(database_url: str) -> TcpProxy:
    """A proxy to the PostgreSQL that `database_url` points at, over TCP or a Unix socket."""
    url = urlsplit(database_url)
    port = url.port or 5432
    socket_dir = dict(parse_qsl(url.query)).get("host", "")
    if socket_dir.startswith("/"):
        return TcpProxy(f"{socket_dir.rstrip('/')}/.s.PGSQL.{port}", port)
    return TcpProxy(socket_dir or url.hostname or "127.0.0.1", port)


def through_proxy(database_url: str, proxy: TcpProxy) -> str:
    """`database_url` pointed at the (started) proxy's loopback port instead of its server."""
    url = urlsplit(database_url)
    netloc = f"127.0.0.1:{proxy.port}"
    if url.username:
        credentials = url.username + (f":{url.password}" if url.password else "")
        netloc = f"{credentials}@{netloc}"
    query = urlencode([(k, v) for k, v in parse_qsl(url.query) if k != "host"])
    return urlunsplit(url._replace(netloc=netloc, query=query))
