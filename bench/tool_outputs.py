"""Latency from a tool-outputs answer to the resumed model request, with a real worker on RabbitMQ.

    .venv/bin/python -m bench.tool_outputs [--samples 200] [--warmup 20]

Set-up: a fresh database (bench/common.py); one `python -m workers` process on RabbitMQ (the
production worker, `STEVORA_WORKER_THREADS` 8); the API in this process (the FastAPI app over
`httpx.ASGITransport`, with the production `DramatiqDispatcher` on the same RabbitMQ queue); the
fake OpenAI server of `stevora.testing.fake_llm` in this process, playing the scripted agent
(one client-executed tool call, then a final answer) and stamping when each request arrives.

Each sample, one at a time: create a run of a one-step `llm` definition whose only tool is
`"execution": "client"`; wait until its `requiredAction` is there; `POST .../tool-outputs`; the
worker claims the resumed run, rebuilds the transcript and calls the model again. Printed, in ms:

* response → model request: from the 200 answer of `tool-outputs` (the caller knows its output is
  recorded) to the fake server receiving the resumed request — the issue's figure (target p50
  ≤ 15 ms). Negative when the worker is faster than the rest of the API response.
* submit → model request: from sending `tool-outputs` to the resumed request.
* tool-outputs response time: the API call alone (validate, record, resume, dispatch, read back).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import structlog

from bench.common import bench_database_url, median, pct
from stevora.testing.fake_llm import FakeLLMServer, FakeResponse, scripted_responder

ROOT = Path(__file__).resolve().parents[1]
BROKER_URL = os.environ.get("STEVORA_BENCH_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672/")
CLIENT_TOOL = {
    "name": "get_location",
    "description": "The user's location (answered by the caller)",
    "parameters": {"type": "object", "properties": {}},
    "execution": "client",
}


class ResumeClock:
    """The fake server's responder: plays the scripted agent and stamps each resumed request
    (one carrying a tool result) with `time.perf_counter()`."""

    def __init__(self) -> None:
        self._respond = scripted_responder("openai")
        self._lock = threading.Lock()
        self._arrived = threading.Event()
        self.resumed_at = 0.0

    def __call__(self, body: dict[str, Any]) -> FakeResponse | dict[str, Any]:
        if any(m.get("role") == "tool" for m in body.get("messages") or []):
            with self._lock:
                self.resumed_at = time.perf_counter()
            self._arrived.set()
        return self._respond(body)

    def arm(self) -> None:
        self._arrived.clear()

    async def wait(self, timeout_s: float = 30.0) -> float:
        if not await asyncio.to_thread(self._arrived.wait, timeout_s):
            raise RuntimeError("the resumed model request never arrived")
        return self.resumed_at


def start_worker(database_url: str, queue: str, fake: FakeLLMServer, threads: int) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "STEVORA_DATABASE_URL": database_url,
        "STEVORA_BROKER_URL": BROKER_URL,
        "STEVORA_QUEUE_NAME": queue,
        "STEVORA_WORKER_THREADS": str(threads),
        "STEVORA_WORKER_PROCESSES": "1",
        "STEVORA_LOG_LEVEL": "WARNING",
        "STEVORA_LOG_FORMAT": "json",
        "OPENAI_API_KEY": "sk-bench",
        "OPENAI_BASE_URL": fake.openai_base_url,
        "PYTHONPATH": str(ROOT),
    }
    return subprocess.Popen([sys.executable, "-m", "workers"], cwd=ROOT, env=env)


async def _api(database_url: str, queue: str) -> tuple[Any, Any]:
    """(runtime, httpx client) for the API in this process, dispatching over RabbitMQ."""
    from stevora.api import create_app
    from stevora.engine.brokers import build_broker
    from stevora.engine.dispatch import DramatiqDispatcher
    from stevora.runtime import Runtime
    from stevora.settings import Settings

    settings = Settings(
        database_url=database_url, broker_url=BROKER_URL, queue_name=queue, rate_limit_per_minute=0
    )
    rt = await Runtime.start(settings, dispatcher=DramatiqDispatcher(build_broker(BROKER_URL), queue))
    app = create_app(settings, runtime=rt)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://bench", timeout=30)
    return rt, client


async def _setup(client: httpx.AsyncClient) -> str:
    """A workspace, its key (sent on the client from now on) and the agent definition's id."""
    slug = f"bench-{secrets.token_hex(4)}"
    ws = (await client.post("/v1/workspaces", json={"name": "bench", "slug": slug})).json()["data"]
    key = await client.post("/v1/api-keys", json={"name": "bench", "workspaceId": ws["id"]})
    client.headers["x-api-key"] = key.json()["data"]["key"]
    step = {"type": "llm", "name": "agent", "model": "gpt-4o-mini", "tools": [CLIENT_TOOL],
            "messages": [{"role": "user", "content": "Where am I?"}]}  # fmt: skip
    definition = await client.post(
        "/v1/workflow-definitions", json={"name": "bench-client-tool", "version": "1", "steps": [step]}
    )
    definition.raise_for_status()
    definition_id: str = definition.json()["data"]["id"]
    return definition_id


async def _sample(
    client: httpx.AsyncClient, clock: ResumeClock, definition_id: str
) -> tuple[float, float, float]:
    """(response → model request, submit → model request, tool-outputs response time), in ms."""
    created = await client.post("/v1/workflow-runs", json={"definitionId": definition_id})
    run_id = created.json()["data"]["id"]
    deadline = time.monotonic() + 30
    while True:
        run = (await client.get(f"/v1/workflow-runs/{run_id}")).json()["data"]
        if run["requiredAction"]:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"run {run_id} never waited for tool outputs: {run['status']}")
        await asyncio.sleep(0.005)
    call_id = run["requiredAction"]["toolCalls"][0]["id"]
    clock.arm()
    body = {"toolOutputs": [{"toolCallId": call_id, "output": {"city": "Lisbon"}}]}
    sent = time.perf_counter()
    response = await client.post(f"/v1/workflow-runs/{run_id}/tool-outputs", json=body)
    answered = time.perf_counter()
    response.raise_for_status()
    resumed = await clock.wait()
    return (resumed - answered) * 1000, (resumed - sent) * 1000, (answered - sent) * 1000


async def _bench(database_url: str, args: argparse.Namespace) -> None:
    queue = f"bench_tool_outputs_{secrets.token_hex(3)}"
    clock = ResumeClock()
    with FakeLLMServer(responder=clock) as fake:
        worker = start_worker(database_url, queue, fake, args.worker_threads)
        rt, client = await _api(database_url, queue)
        try:
            definition_id = await _setup(client)
            for _ in range(args.warmup):
                await _sample(client, clock, definition_id)
            samples = [await _sample(client, clock, definition_id) for _ in range(args.samples)]
        finally:
            await client.aclose()
            await rt.close()
            worker.terminate()
            worker.wait(15)
    to_model, submit_to_model, api = (list(column) for column in zip(*samples, strict=True))
    print(
        f"tool outputs → resumed model request: {args.samples} runs one at a time (after {args.warmup} "
        f"warm-up), 1 worker process ({args.worker_threads} threads) on RabbitMQ, API in-process"
    )
    for label, values in (
        ("response → model request", to_model),
        ("submit → model request", submit_to_model),
        ("tool-outputs response time", api),
    ):
        print(f"  {label:<27} p50 {median(values):7.2f} ms   p99 {pct(values, 99):7.2f} ms")
    verdict = "met" if median(to_model) <= 15 else "MISSED"
    print(f"  target p50 ≤ 15 ms (response → model request): {verdict}")


def main(argv: list[str] | None = None) -> None:
    # The API in this process logs `run_created` per run at INFO; keep the figures readable.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--worker-threads", type=int, default=8)
    args = parser.parse_args(argv)
    asyncio.run(_bench(bench_database_url("tool_outputs"), args))


if __name__ == "__main__":
    main()
