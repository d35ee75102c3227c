"""Private dependencies for the chaos suite, so that restarting them disturbs nobody else.

* PostgreSQL: a throwaway cluster (`initdb` into a temp dir, run as the `postgres` OS user when
  the suite runs as root) on a free loopback port; `restart()` is `pg_ctl restart -m fast`.
* Redis: a private `redis-server` without persistence; `restart()` kills it and starts a new one
  on the same port (queued messages are lost, as in a real crash: the sweep must cover that).
* RabbitMQ: a private node would need its own Erlang distribution ports, cookie and ~10 s to
  boot on these 2 cores, so the suite uses the machine's RabbitMQ with a private queue and puts
  a TCP proxy in front of it. `restart()` cuts every proxied connection and refuses new ones for
  a moment: what clients see of a broker restart (durable queues survive it too).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import asyncpg

PG_BIN = next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)), None)

ARTIFACTS = Path(__file__).resolve().parents[3] / "test-artifacts"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout_s}s")


class PrivatePostgres:
    def __init__(self) -> None:
        if PG_BIN is None:
            raise RuntimeError("no PostgreSQL server binaries under /usr/lib/postgresql")
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="stevora-chaos-pg-"))
        self.data = self.dir / "data"
        self._as_postgres = os.geteuid() == 0  # initdb refuses to run as root
        if self._as_postgres:
            shutil.chown(self.dir, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync")
        self.url = f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        assert PG_BIN is not None
        cmd = [str(PG_BIN / tool), *args]
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        # Never a pipe: a (re)started postmaster inherits pg_ctl's stdout and would hold it open.
        with (self.dir / "pg_ctl.log").open("ab") as out:
            subprocess.run(
                cmd, check=True, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=120
            )

    def start(self) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.dir} -c fsync=off "
            "-c full_page_writes=off -c max_connections=200"
            # Extra server options for a diagnosis, e.g. "-c log_statement=all -c log_line_prefix='%m [%p] '".
            + (
                f" {os.environ['STEVORA_CHAOS_PG_OPTIONS']}"
                if os.environ.get("STEVORA_CHAOS_PG_OPTIONS")
                else ""
            )
        )
        self._run(
            "pg_ctl", "start", "-w", "-D", str(self.data), "-l", str(self.dir / "pg.log"), "-o", options
        )

    def restart(self) -> None:
        self._run(
            "pg_ctl", "restart", "-w", "-m", "fast", "-D", str(self.data), "-l", str(self.dir / "pg.log")
        )

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "stop", "-w", "-m", "immediate", "-D", str(self.data))
        finally:
            self._keep_log_with_errors()
            shutil.rmtree(self.dir, ignore_errors=True)

    def _keep_log_with_errors(self) -> None:
        """The server log names both statements of a deadlock (the client only gets a hint):
        keep it under test-artifacts/ when it has one."""
        log = self.dir / "pg.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        if "deadlock detected" in text:
            kept = ARTIFACTS / f"{self.dir.name}.log"
            kept.parent.mkdir(parents=True, exist_ok=True)
            kept.write_text(text)

    async def terminate_backends(self) -> int:
        conn = await asyncpg.connect(f"postgresql://postgres@127.0.0.1:{self.port}/postgres")
        try:
            return int(
                await conn.fetchval(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'"
                )
            )
        finally:
            await conn.close()


class PrivateRedis:
    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_port(self.port, 10)

    def restart(self, down_s: float = 1.0) -> None:
        self.stop()
        time.sleep(down_s)
        self.start()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class FaultProxy:
    """A loopback TCP proxy whose `restart()` drops every connection and refuses for a while."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._call(self._listen())

    def _call(self, coro: object) -> object:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)  # type: ignore[arg-type]

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port, reuse_address=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.CancelledError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers.difference_update((writer, up_writer))

    async def _cut(self) -> None:
        assert self._server is not None
        self._server.close()
        for w in list(self._writers):
            w.transport.abort()
        self._writers.clear()
        await self._server.wait_closed()

    def restart(self, down_s: float = 2.0) -> None:
        self._call(self._cut())
        time.sleep(down_s)
        self._call(self._listen())

    def stop(self) -> None:
        try:
            self._call(self._cut())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()  # its self-pipe is a socket pair: leaving it to GC warns
