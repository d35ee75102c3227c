"""The embedded stack behind `stevora dev` and `stevora demo`: embedded PostgreSQL, migrations,
Dramatiq's in-process broker with an in-process worker, and the API — same code paths as a
deployment with PostgreSQL + RabbitMQ, nothing to install and no API keys needed."""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import asyncpg
import structlog

from stevora.db.database import asyncpg_dsn
from stevora.db.devkeys import dev_key
from stevora.db.migrate import upgrade_head
from stevora.embedded import (
    adopt_left_running,
    forget_dead_users,
    postgres_pid,
    process_running,
    start_embedded_postgres,
    stop_postgres,
)
from stevora.llm.providers import offline_when_keyless
from stevora.settings import Settings

log = structlog.get_logger("stevora.dev")


async def _ensure_dev_key(database_url: str, existing: str | None) -> tuple[str, bool]:
    """The `default` workspace's dev key: `existing` if it still works, else a new one (True)."""
    conn = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        return await dev_key(conn, existing)
    finally:
        await conn.close()


def ensure_dev_key(database_url: str, key_file: Path) -> str:
    """A workspace `default` and an API key for it. The raw key is kept in the data folder (local
    development only) so every start prints the same key."""
    existing = key_file.read_text().strip() if key_file.exists() else None
    raw, created = asyncio.run(_ensure_dev_key(database_url, existing))
    if created:
        key_file.write_text(raw + "\n")
        key_file.chmod(0o600)
    return raw


class PortInUse(RuntimeError):
    """The API port is taken (another `stevora dev`, or any other program)."""


def bind_api_socket(host: str, port: int) -> socket.socket:
    """Bind the API's listening socket before anything starts, so a busy port fails at once and
    clearly instead of after PostgreSQL started (and printing a key the other server won't know)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT leftovers are fine
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno in (errno.EADDRINUSE, errno.EACCES):
            raise PortInUse(
                f"port {port} on {host} is already in use (another `stevora dev`?); "
                "stop it or pick another port with --port"
            ) from exc
        raise
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def exit_on_sigterm() -> None:
    """Make SIGTERM (Docker, systemd, supervisors) unwind like Ctrl-C, so `finally` blocks stop the
    embedded PostgreSQL. uvicorn re-raises the signal it caught once it has shut down; with the
    default handler that would kill the process before our cleanup runs.

    SIGHUP (the terminal running `make dev` was closed) is handled as SIGTERM. The terminal is gone,
    so output goes to /dev/null from then on: a write to the dead terminal (a shutdown log line)
    would fail and could cut the cleanup short."""

    def terminate(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    def hang_up(_signum: int, _frame: object) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        for fd in (1, 2):
            os.dup2(devnull, fd)
        os.close(devnull)
        signal.raise_signal(signal.SIGTERM)  # uvicorn's handler while it serves, else `terminate`

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGHUP, hang_up)


def _is_stevora(pid: int) -> bool:
    import psutil

    try:
        return any("stevora" in part for part in psutil.Process(pid).cmdline())
    except psutil.Error:
        return False


def stop_dev(data_dir: Path, *, timeout: float = 60) -> tuple[list[str], bool]:
    """`stevora dev --stop`: stop what runs on this data folder — a `stevora dev` (or `demo`) still
    running is sent SIGTERM (it stops its PostgreSQL on the way out), and an embedded PostgreSQL
    that an earlier process left behind is stopped. Returns (what was done, True if all stopped)."""
    done: list[str] = []
    live, _ = forget_dead_users(data_dir)
    live = [pid for pid in live if pid != os.getpid()]
    others = [pid for pid in live if not _is_stevora(pid)]
    for pid in live:
        if pid in others:
            continue
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while process_running(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        done.append(
            f"stopped stevora (pid {pid})"
            if not process_running(pid)
            else f"stevora (pid {pid}) did not exit"
        )
    if others:
        done.append(
            f"left PostgreSQL running: process {', '.join(map(str, others))} (not stevora) still uses it"
        )
        return done, False
    pg_pid = stop_postgres(data_dir, timeout=timeout)
    if pg_pid is not None:
        done.append(f"stopped embedded PostgreSQL (pid {pg_pid}) in {Path(data_dir).resolve() / 'pg'}")
    if not done:
        done.append(f"nothing was running on {Path(data_dir).resolve()}")
    return done, postgres_pid(data_dir) is None


class DevStack:
    def __init__(
        self, settings: Settings, *, host: str = "127.0.0.1", port: int = 3000, worker_threads: int = 4
    ) -> None:
        self.base_settings = settings
        self.host = host
        self.port = port
        self.worker_threads = worker_threads
        self.settings: Settings | None = None
        self.api_key = ""
        self.notice: str | None = None  # what start_backend found and did that the user should know
        self._pg: Any = None
        self._broker: Any = None
        self._worker: Any = None
        self._server: Any = None
        self._api_thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start_backend(self) -> Settings:
        """PostgreSQL, migrations, the in-process worker and the dev key. Returns the settings used."""
        from workers.main import build_worker  # the CLI is the process edge that starts workers

        data_dir = Path(self.base_settings.data_dir)
        data_dir.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        self.notice = adopt_left_running(data_dir)
        if self.notice:
            log.warning("dev_postgres_adopted", detail=self.notice)
        self._pg, database_url = start_embedded_postgres(data_dir)
        settings = offline_when_keyless(
            self.base_settings.model_copy(
                update={
                    "database_url": database_url,
                    "broker_url": "stub://dev",
                    "port": self.port,
                    # Local development delivers webhooks to local receivers.
                    "webhook_allow_private": True,
                    "mcp_allow_private": True,
                }
            )
        )
        upgrade_head(database_url)
        self.api_key = ensure_dev_key(database_url, data_dir / "dev-api-key")
        self._broker, self._worker = build_worker(settings, threads=self.worker_threads)
        self._worker.start()
        log.info("dev_backend_ready", seconds=round(time.perf_counter() - started, 2), data_dir=str(data_dir))
        self.settings = settings
        return settings

    def serve(self, sock: socket.socket) -> None:
        """Serve the API on `sock` (from `bind_api_socket`) in this thread until a signal."""
        server = self.make_server()
        server.run(sockets=[sock])

    def make_server(self) -> Any:
        import uvicorn

        from stevora.api.app import create_app
        from stevora.logging import uvicorn_log_settings

        assert self.settings is not None
        config = uvicorn.Config(
            create_app(self.settings), host=self.host, port=self.port, **uvicorn_log_settings()
        )
        self._server = uvicorn.Server(config)
        return self._server

    def start_api_in_thread(self) -> None:
        server = self.make_server()
        self._api_thread = threading.Thread(target=server.run, name="stevora-api", daemon=True)
        self._api_thread.start()
        deadline = time.monotonic() + 30
        while not server.started:
            if time.monotonic() > deadline or not self._api_thread.is_alive():
                raise RuntimeError(f"the API did not start on {self.url}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            if self._api_thread is not None:
                self._api_thread.join(timeout=10)
        if self._worker is not None:
            self._worker.stop()
            self._broker.close()
        if self._pg is not None:
            self._pg.cleanup()
