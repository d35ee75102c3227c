"""The process commands as a user runs them: `stevora migrate`, `dev`, `api --workers`, `worker`."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from alembic import command

from stevora.client import AsyncAgentRuntime
from stevora.db.migrate import alembic_config
from tests.conftest import _admin, _with_database
from tests.e2e.conftest import require_broker

ROOT = Path(__file__).resolve().parents[2]
STEVORA = [sys.executable, "-m", "stevora.cli"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STEVORA_", "OPENAI_", "ANTHROPIC_"))}
    env.update(PYTHONPATH=str(ROOT), STEVORA_LOG_LEVEL="WARNING", **extra)
    return env


def _start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen([*STEVORA, *args], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


# Ctrl-C: uvicorn shuts down cleanly, then re-raises the signal, so a server exits 130 (128+SIGINT).
CLEAN_EXIT = {0, 130}


def _stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def _tail(log: Path) -> str:
    return log.read_text()[-3000:]


async def _wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient() as client:
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"process exited early:\n{_tail(log)}"
            try:
                if (await client.get(f"{url}/health")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.2)
    raise AssertionError(f"{url} never became healthy:\n{_tail(log)}")


@pytest.fixture
def fresh_database_url(database_url: str) -> Iterator[str]:
    name = f"stevora_cli_{secrets.token_hex(4)}"
    asyncio.run(_admin(database_url, f'CREATE DATABASE "{name}"'))
    yield _with_database(database_url, name)
    asyncio.run(_admin(database_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def test_migrate_brings_an_empty_database_to_head(fresh_database_url: str) -> None:
    done = subprocess.run(
        [*STEVORA, "migrate", "--database-url", fresh_database_url],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "up to date" in done.stdout + done.stderr
    command.check(alembic_config(fresh_database_url))  # schema at head, matching the models


async def test_dev_serves_the_api_and_ui_and_runs_the_example_agent_offline(tmp_path: Path) -> None:
    port = _free_port()
    log = tmp_path / "dev.log"
    proc = _start(
        ["dev", "--port", str(port), "--data-dir", str(tmp_path / "data"), "--tools", "examples.tools"],
        _env(),
        log,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        await _wait_healthy(url, proc, log)
        key = (tmp_path / "data" / "dev-api-key").read_text().strip()
        assert key in log.read_text()  # the key is printed for the user
        async with AsyncAgentRuntime(key, base_url=url) as client:
            spec = json.loads((ROOT / "examples" / "research-agent.json").read_text())
            definition = await client.definitions.apply(spec)
            run = await client.workflows.create(
                definition.id, {"question": "Refunds?", "customerId": "cus_42"}
            )
            run = await client.workflows.wait_for_completion(run.id, timeout=60, poll_interval=0.2)
            assert run.status == "COMPLETED"
            traces = await client.workflows.tool_traces(run.id)
            assert {t.tool_name for t in traces} == {"search_knowledge_base", "get_customer_data"}
        async with httpx.AsyncClient() as http:
            assert (await http.get(f"{url}/ui/login")).status_code == 200
    finally:
        assert _stop(proc) in CLEAN_EXIT, log.read_text()[-3000:]
    assert (tmp_path / "data" / "pg" / "PG_VERSION").exists()  # data persists in the folder


@pytest.mark.broker
async def test_api_with_two_workers_and_a_worker_process_run_an_approval_workflow(
    fresh_database_url: str, tmp_path: Path
) -> None:
    broker = require_broker("rabbitmq")
    queue = f"cli-{secrets.token_hex(4)}"
    env = _env(
        STEVORA_DATABASE_URL=fresh_database_url,
        STEVORA_BROKER_URL=broker,
        STEVORA_QUEUE_NAME=queue,
        STEVORA_SWEEP_INTERVAL_S="0.5",
    )
    migrate = await asyncio.create_subprocess_exec(*STEVORA, "migrate", cwd=ROOT, env=env)
    assert await asyncio.wait_for(migrate.wait(), 120) == 0
    port = _free_port()
    api = _start(["api", "--port", str(port), "--workers", "2"], env, tmp_path / "api.log")
    worker = _start(["worker", "--tools", "examples.tools", "--threads", "4"], env, tmp_path / "worker.log")
    url = f"http://127.0.0.1:{port}"
    try:
        await _wait_healthy(url, api, tmp_path / "api.log")
        async with AsyncAgentRuntime(base_url=url) as anonymous:
            workspace = await anonymous.workspaces.create("CLI test", f"cli-{secrets.token_hex(3)}")
            key = await anonymous.api_keys.create("first", workspace_id=workspace.id)
        async with AsyncAgentRuntime(key.key, base_url=url) as client:
            spec = json.loads((ROOT / "examples" / "lead-onboarding.json").read_text())
            definition = await client.definitions.apply(spec)
            run = await client.workflows.create(definition.id, {"email": "a@big.example", "companySize": 500})
            for _ in range(300):
                pending = [
                    a for a in await client.approvals.list(pending=True) if a.workflow_run_id == run.id
                ]
                if pending:
                    break
                await asyncio.sleep(0.1)
            assert pending, (tmp_path / "worker.log").read_text()[-3000:]
            await client.approvals.decide(pending[0].id, "approved", decided_by="cli-test")
            run = await client.workflows.wait_for_completion(run.id, timeout=60, poll_interval=0.2)
            assert run.status == "COMPLETED"
            assert run.state["sentSubject"].startswith("Welcome to Stevora")
    finally:
        assert _stop(worker) in CLEAN_EXIT, (tmp_path / "worker.log").read_text()[-3000:]
        _stop(api)
