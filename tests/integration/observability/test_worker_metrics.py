"""A worker's metrics port, and several worker processes summed through PROMETHEUS_MULTIPROC_DIR."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from stevora.observability import metrics


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_worker_serves_its_metrics_on_the_metrics_port() -> None:
    metrics.SWEEP_PICKUPS.inc(3)
    server = metrics.serve_worker_metrics("127.0.0.1", _free_port())
    assert server is not None
    try:
        response = httpx.get(f"http://127.0.0.1:{server.server_port}/metrics")
    finally:
        server.shutdown()
        server.server_close()
    assert response.status_code == 200
    assert "stevora_sweep_pickups_total" in response.text
    assert metrics.serve_worker_metrics("127.0.0.1", 0) is None


def test_with_a_token_a_workers_metrics_port_needs_it_as_a_bearer_token() -> None:
    server = metrics.serve_worker_metrics("127.0.0.1", _free_port(), token="w0rker-t0ken")
    assert server is not None
    url = f"http://127.0.0.1:{server.server_port}/metrics"
    try:
        missing = httpx.get(url)
        wrong = httpx.get(url, headers={"Authorization": "Bearer nope"})
        right = httpx.get(url, headers={"Authorization": "Bearer w0rker-t0ken"})
    finally:
        server.shutdown()
        server.server_close()
    for refused in (missing, wrong):
        assert refused.status_code == 401 and "stevora_" not in refused.text
        assert refused.headers["www-authenticate"].startswith("Bearer")
    assert right.status_code == 200 and "stevora_sweep_pickups_total" in right.text


CHILD = """
from stevora.observability import metrics
metrics.RUNS_CREATED.inc()
metrics.RUNS_IN_FLIGHT.inc()
"""


def test_several_worker_processes_are_summed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for _ in range(2):
        subprocess.run(
            [sys.executable, "-c", CHILD], check=True, env={"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
        )
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    body, _ = metrics.exposition()
    samples = {
        s.name: s.value
        for f in text_string_to_metric_families(body.decode())
        for s in f.samples
        if not s.labels
    }
    assert samples["stevora_runs_created_total"] == 2
    assert samples["stevora_runs_in_flight"] == 2
    # Both processes have exited: their in-flight gauges count for nothing once marked dead.
    for pid_file in tmp_path.glob("gauge_livesum_*.db"):
        metrics.process_exited(int(pid_file.stem.rsplit("_", 1)[-1]))
    body, _ = metrics.exposition()
    samples = {
        s.name: s.value
        for f in text_string_to_metric_families(body.decode())
        for s in f.samples
        if not s.labels
    }
    assert samples.get("stevora_runs_in_flight", 0.0) == 0.0
    assert samples["stevora_runs_created_total"] == 2
