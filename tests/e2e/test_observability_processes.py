"""Observability as an operator sees it: JSON logs with startup and access lines from `stevora api`,
and the summed metrics of `stevora worker --processes 2` on its metrics port."""

from __future__ import annotations

import asyncio
import json
import secrets
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from stevora.client import AsyncAgentRuntime
from tests.e2e.conftest import require_broker
from tests.e2e.test_cli_processes import (
    CLEAN_EXIT,
    ROOT,
    STEVORA,
    _env,
    _free_port,
    _start,
    _stop,
    _wait_healthy,
    fresh_database_url,
)

__all__ = ["fresh_database_url"]


def _json_lines(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


def _sample(text: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return 0.0


async def test_api_logs_json_with_access_lines_and_two_worker_processes_serve_summed_metrics(
    fresh_database_url: str, tmp_path: Path
) -> None:
    env = _env(
        STEVORA_DATABASE_URL=fresh_database_url,
        STEVORA_BROKER_URL=require_broker("rabbitmq"),
        STEVORA_QUEUE_NAME=f"obs-{secrets.token_hex(4)}",
        STEVORA_LOG_FORMAT="json",
        STEVORA_ACCESS_LOG="true",
    )
    env["STEVORA_LOG_LEVEL"] = "INFO"  # the startup lines are INFO
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    migrate = await asyncio.create_subprocess_exec(*STEVORA, "migrate", cwd=ROOT, env=env)
    assert await asyncio.wait_for(migrate.wait(), 120) == 0
    port, metrics_port = _free_port(), _free_port()
    api_log, worker_log = tmp_path / "api.log", tmp_path / "worker.log"
    api = _start(["api", "--port", str(port)], env, api_log)
    worker = _start(
        ["worker", "--processes", "2", "--threads", "2"],
        {**env, "STEVORA_METRICS_PORT": str(metrics_port)},
        worker_log,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        await _wait_healthy(url, api, api_log)
        async with AsyncAgentRuntime(base_url=url) as anonymous:
            workspace = await anonymous.workspaces.create("Obs test", f"obs-{secrets.token_hex(3)}")
            key = await anonymous.api_keys.create("first", workspace_id=workspace.id)
        async with AsyncAgentRuntime(key.key, base_url=url) as client:
            spec = {"name": "obs", "version": "1", "steps": [{"type": "wait", "name": "w", "durationMs": 0}]}
            definition = await client.definitions.apply(spec)
            runs = [await client.workflows.create(definition.id, {}) for _ in range(4)]
            for run in runs:
                done = await client.workflows.wait_for_completion(run.id, timeout=60, poll_interval=0.2)
                assert done.status == "COMPLETED"
        async with httpx.AsyncClient() as http:
            api_metrics = (await http.get(f"{url}/metrics")).text
            worker_metrics = (await http.get(f"http://127.0.0.1:{metrics_port}/metrics")).text
    finally:
        assert _stop(worker) in CLEAN_EXIT, worker_log.read_text()[-3000:]
        _stop(api)

    assert _sample(api_metrics, "stevora_runs_created_total") == 4
    # Both worker processes' counters, summed by the parent through PROMETHEUS_MULTIPROC_DIR.
    assert _sample(worker_metrics, "stevora_runs_finished_total", status="COMPLETED") == 4, worker_metrics
    assert _sample(worker_metrics, "stevora_queue_lag_seconds_count") >= 4

    api_lines = _json_lines(api_log)
    [listening] = [line for line in api_lines if line["event"] == "api_listening"]
    assert listening["url"] == url and listening["metrics"] == f"{url}/metrics"
    assert listening["broker"] == "amqp://127.0.0.1:5672/"  # no credentials
    assert not any("color_message" in line for line in api_lines)
    access = [line for line in api_lines if line.get("logger") == "uvicorn.access"]
    assert any("/v1/workspaces" in line["event"] for line in access), api_lines[-5:]
    ready = [line for line in _json_lines(worker_log) if line["event"] == "worker_ready"]
    assert len(ready) == 2 and all(line["queue"] == env["STEVORA_QUEUE_NAME"] for line in ready)
