"""Start real `python -m workers` processes against the test database and a real broker."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


class WorkerProcess:
    def __init__(
        self,
        database_url: str,
        broker_url: str,
        queue_name: str,
        *,
        fault: str | None = None,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        env = {
            **os.environ,
            "STEVORA_DATABASE_URL": database_url,
            "STEVORA_BROKER_URL": broker_url,
            "STEVORA_QUEUE_NAME": queue_name,
            "STEVORA_TOOL_MODULES": json.dumps(["tests.e2e.crash_tools"]),
            "STEVORA_LEASE_S": "2",
            "STEVORA_HEARTBEAT_S": "0.5",
            "STEVORA_SWEEP_INTERVAL_S": "0.5",
            "STEVORA_UNDISPATCHED_GRACE_S": "1",
            "STEVORA_WORKER_THREADS": "4",
            "STEVORA_LOG_FORMAT": "json",
            "STEVORA_LOG_LEVEL": "WARNING",
            "PYTHONPATH": str(ROOT),
            **(extra_env or {}),
        }
        env.pop("STEVORA_FAULT_INJECTION", None)
        if fault:
            env["STEVORA_FAULT_INJECTION"] = fault
        self.log_path = ROOT / "test-artifacts" / f"worker-{queue_name}-{os.getpid()}-{id(self)}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "workers"], cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT
        )

    async def wait_exit(self, timeout_s: float) -> int:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self.proc.poll() is None:
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"worker did not exit; log: {self.log_path.read_text()[-3000:]}")
            await asyncio.sleep(0.05)
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()

    def log_tail(self) -> Any:
        return self.log_path.read_text(errors="replace")[-3000:]
