"""Serving the API: one uvicorn process, or several sharing the port with SO_REUSEPORT.

The API is CPU-bound Python; on a machine with N cores, N processes serve about N times the
requests (each with its own Runtime and connection pools). The kernel balances connections
between processes that bound the same port with SO_REUSEPORT, so no master process sits in the
request path.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import signal
import socket

import structlog

from stevora.logging import configure_logging, uvicorn_log_settings
from stevora.observability.logs import redact_url
from stevora.settings import Settings

log = structlog.get_logger("stevora.api")


def reuse_port_socket(host: str, port: int) -> socket.socket:
    # proto must be IPPROTO_TCP: asyncio sets TCP_NODELAY on accepted connections only when it is,
    # and without it every response waits for the client's delayed ACK (~40 ms).
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def _serve_one(settings: Settings, reuse_port: bool) -> None:
    import uvicorn

    from stevora.api.app import create_app

    configure_logging(settings)
    config = uvicorn.Config(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        **uvicorn_log_settings(access_log=settings.access_log),
    )
    server = uvicorn.Server(config)
    log.info(
        "api_listening",
        url=f"http://{settings.host}:{settings.port}",
        metrics=f"http://{settings.host}:{settings.port}/metrics",
        broker=redact_url(settings.broker_url),
        queue=settings.queue_name,
        access_log=settings.access_log,
    )
    if reuse_port:
        asyncio.run(server.serve(sockets=[reuse_port_socket(settings.host, settings.port)]))
    else:
        server.run()


def serve(settings: Settings, *, workers: int = 1) -> None:
    """Serve until SIGINT/SIGTERM; `workers > 1` starts that many processes on the same port."""
    if workers <= 1:
        _serve_one(settings, reuse_port=False)
        return
    ctx = multiprocessing.get_context("spawn")
    children = [ctx.Process(target=_serve_one, args=(settings, True)) for _ in range(workers)]
    for child in children:
        child.start()

    def stop(_signum: int, _frame: object) -> None:
        for child in children:
            if child.is_alive():
                child.terminate()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for child in children:
        child.join()
