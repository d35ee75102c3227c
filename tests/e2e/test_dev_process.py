"""`stevora dev` as supervisors and people run it: a busy port fails at once and clearly; SIGTERM
(what Docker, systemd and supervisors send) and closing the terminal (SIGHUP) stop the embedded
PostgreSQL as Ctrl-C does; after a `kill -9` the next start adopts the PostgreSQL left running and
says so; `stevora dev --stop` stops whatever runs on the data folder."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import pty
import re
import select
import signal
import socket
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

from tests.e2e.test_cli_processes import ROOT, STEVORA, _env, _free_port, _start, _tail, _wait_healthy


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_dev_on_a_busy_port_fails_clearly_without_starting_anything(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        log = tmp_path / "dev.log"
        proc = _start(["dev", "--port", str(port), "--data-dir", str(tmp_path / "data")], _env(), log)
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError(f"stevora dev kept running on a busy port:\n{_tail(log)}") from None
    out = log.read_text()
    assert code == 1, out
    assert f"port {port} on 127.0.0.1 is already in use" in out
    assert "Stevora is running" not in out and "API key" not in out
    assert not (tmp_path / "data" / "pg" / "postmaster.pid").exists()  # PostgreSQL never started


async def test_sigterm_stops_dev_and_its_embedded_postgres(tmp_path: Path) -> None:
    port = _free_port()
    log = tmp_path / "dev.log"
    proc = _start(["dev", "--port", str(port), "--data-dir", str(tmp_path / "data")], _env(), log)
    try:
        await _wait_healthy(f"http://127.0.0.1:{port}", proc, log)
        # The banner says where everything listens, the scrape address included.
        banner = log.read_text()
        assert f"http://127.0.0.1:{port}/metrics" in banner and f"http://127.0.0.1:{port}/docs" in banner, (
            banner
        )
        # Not a terminal (a log file): each banner line is whole, not wrapped at 80 columns.
        data = (tmp_path / "data").resolve()
        assert re.search(rf"^API key: stv_\w+ +data: {re.escape(str(data))}$", banner, re.M), banner
        pid_file = tmp_path / "data" / "pg" / "postmaster.pid"
        postgres_pid = int(pid_file.read_text().splitlines()[0])
        assert _alive(postgres_pid)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.monotonic() + 20
    while _alive(postgres_pid) and time.monotonic() < deadline:  # noqa: ASYNC110 (another process)
        await asyncio.sleep(0.1)
    assert not _alive(postgres_pid), f"embedded PostgreSQL {postgres_pid} still runs:\n{_tail(log)}"
    assert not pid_file.exists()


def _postgres_pid(data: Path) -> int:
    return int((data / "pg" / "postmaster.pid").read_text().splitlines()[0])


async def _gone(pid: int, timeout_s: float = 20) -> bool:
    deadline = time.monotonic() + timeout_s
    while _alive(pid) and time.monotonic() < deadline:  # noqa: ASYNC110 (another process)
        await asyncio.sleep(0.1)
    return not _alive(pid)


def _handle_pids(data: Path) -> list[int]:
    return list(json.loads((data / "pg" / ".handle_pids.json").read_text() or "[]"))


def _dev_stop(data: Path) -> str:
    done = subprocess.run(
        [*STEVORA, "dev", "--stop", "--data-dir", str(data)],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def _start_in_a_terminal(args: list[str]) -> tuple[int, subprocess.Popen[bytes]]:
    """`stevora <args>` in its own session with a pty as controlling terminal, as a shell in a
    terminal window runs it. Returns (the terminal's master side, the process)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [*STEVORA, *args], cwd=ROOT, env=_env(), stdin=slave, stdout=slave, stderr=slave,
        start_new_session=True, preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
    )  # fmt: skip
    os.close(slave)
    return master, proc


async def test_closing_the_terminal_stops_dev_and_its_embedded_postgres(tmp_path: Path) -> None:
    """`make dev` in a terminal that is then closed: the kernel hangs up the terminal's session."""
    port, data, log = _free_port(), tmp_path / "data", tmp_path / "dev.log"
    master, proc = _start_in_a_terminal(["dev", "--port", str(port), "--data-dir", str(data)])
    reading = threading.Event()
    reading.set()

    def pump() -> None:  # the terminal shows what dev prints (and its buffer never fills)
        with log.open("ab") as out:
            while reading.is_set():
                if select.select([master], [], [], 0.1)[0]:
                    try:
                        out.write(os.read(master, 65536))
                    except OSError:
                        return
                    out.flush()

    pumper = threading.Thread(target=pump, daemon=True)
    pumper.start()
    try:
        await _wait_healthy(f"http://127.0.0.1:{port}", proc, log)
        postgres_pid = _postgres_pid(data)
        assert _alive(postgres_pid)
        reading.clear()
        pumper.join(timeout=5)
        os.close(master)  # the terminal window closes: SIGHUP to the session
        proc.wait(timeout=60)
    finally:
        reading.clear()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert await _gone(postgres_pid), f"embedded PostgreSQL {postgres_pid} still runs:\n{_tail(log)}"
    assert _handle_pids(data) == []  # no dead pid left behind to keep the next server running


async def test_after_kill_9_the_next_dev_adopts_the_postgres_left_running(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first_port, first_log = _free_port(), tmp_path / "first.log"
    first = _start(["dev", "--port", str(first_port), "--data-dir", str(data)], _env(), first_log)
    second = None
    try:
        await _wait_healthy(f"http://127.0.0.1:{first_port}", first, first_log)
        postgres_pid = _postgres_pid(data)
        first.kill()  # kill -9: no cleanup runs
        first.wait()
        assert _alive(postgres_pid) and _handle_pids(data) == [first.pid]  # what a kill -9 leaves

        port, log = _free_port(), tmp_path / "second.log"
        second = _start(["dev", "--port", str(port), "--data-dir", str(data)], _env(), log)
        await _wait_healthy(f"http://127.0.0.1:{port}", second, log)
        said = log.read_text()
        assert f"embedded PostgreSQL (pid {postgres_pid}) was still running" in said, said
        assert f"(pid {first.pid}, gone)" in said and "stopping it when this one exits" in said, said
        assert _postgres_pid(data) == postgres_pid and _handle_pids(data) == [second.pid]

        # `stevora dev --stop` from another terminal: the running dev stops, and with it PostgreSQL.
        out = _dev_stop(data)
        assert f"stopped stevora (pid {second.pid})" in out, out
        assert second.wait(timeout=30) is not None
        assert await _gone(postgres_pid), f"embedded PostgreSQL {postgres_pid} still runs:\n{_tail(log)}"
        assert "nothing was running" in _dev_stop(data)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


def _crash_after_starting_postgres(data: Path) -> None:
    """A process that starts the embedded PostgreSQL and dies without running its exit handlers."""
    crash = "import os, sys; from stevora.embedded import start_embedded_postgres as s; s(sys.argv[1]); os._exit(0)"
    subprocess.run([sys.executable, "-c", crash, str(data)], cwd=ROOT, env=_env(), check=True, timeout=90)


async def test_dev_stop_stops_a_postgres_left_behind(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _crash_after_starting_postgres(data)
    postgres_pid = _postgres_pid(data)
    assert _alive(postgres_pid)
    try:
        out = _dev_stop(data)
        assert f"stopped embedded PostgreSQL (pid {postgres_pid})" in out, out
        assert await _gone(postgres_pid)
        assert not (data / "pg" / "postmaster.pid").exists()
    finally:
        if _alive(postgres_pid):
            os.kill(postgres_pid, signal.SIGKILL)
