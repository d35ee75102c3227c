"""`stevora dev` as supervisors run it: a busy port fails at once and clearly, and SIGTERM (what
Docker, systemd and supervisors send) stops the embedded PostgreSQL as Ctrl-C does."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from tests.e2e.test_cli_processes import _env, _free_port, _start, _tail, _wait_healthy


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
