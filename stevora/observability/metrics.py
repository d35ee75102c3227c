"""Prometheus metrics (prometheus-client): what the API's `/metrics` and a worker's metrics port serve.

The metric objects live in prometheus-client's process-wide registry, as that library intends:
the embedded `stevora dev` process (API and worker in one) then shows both sides on one
`/metrics`. With several worker processes (`stevora worker --processes N`) each child writes its
values to files in `PROMETHEUS_MULTIPROC_DIR` and the parent serves their sum (prometheus-client's
multiprocess mode; the directory must be set before the children start, which `serve_worker_metrics`
does). Names and example PromQL: docs/observability.md.
"""

from __future__ import annotations

import os
import tempfile
from datetime import datetime
from typing import TYPE_CHECKING
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
    start_http_server,
)

from stevora.clock import utcnow

if TYPE_CHECKING:
    from stevora.llm.messages import Usage

# Seconds; LLM calls take seconds to minutes, steps and queue hops milliseconds to hours.
_FAST = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_SLOW = (0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)

RUNS_CREATED = Counter("stevora_runs_created", "Workflow runs created")
RUNS_FINISHED = Counter("stevora_runs_finished", "Workflow runs that reached a terminal status", ["status"])
RUNS_IN_FLIGHT = Gauge(
    "stevora_runs_in_flight", "Runs a worker process is executing now", multiprocess_mode="livesum"
)
STEP_DURATION = Histogram(
    "stevora_step_duration_seconds",
    "One execution of a step (until it completes, fails or starts waiting)",
    ["step_type", "status"],
    buckets=_SLOW,
)
LLM_CALL_DURATION = Histogram(
    "stevora_llm_call_duration_seconds",
    "Model call latency (SDK retries included)",
    ["provider", "model", "status"],
    buckets=_SLOW,
)
LLM_TIME_TO_FIRST_TOKEN = Histogram(
    "stevora_llm_time_to_first_token_seconds",
    "Time to the first streamed token of a model call",
    ["provider", "model"],
    buckets=_FAST,
)
LLM_TOKENS = Counter("stevora_llm_tokens", "Tokens used by model calls", ["provider", "model", "kind"])
LLM_COST = Counter("stevora_llm_cost_usd", "Cost of model calls in USD", ["provider", "model"])
TOOL_CALL_DURATION = Histogram(
    "stevora_tool_call_duration_seconds", "Tool handler latency", ["tool", "status"], buckets=_FAST
)
TOOL_CALL_ERRORS = Counter("stevora_tool_call_errors", "Tool calls that failed", ["tool", "code"])
QUEUE_LAG = Histogram(
    "stevora_queue_lag_seconds",
    "From a run's dispatch (or the time it became due) to a worker claiming it",
    buckets=_FAST,
)
SWEEP_PICKUPS = Counter("stevora_sweep_pickups", "Runs the recovery sweep dispatched")
BUDGET_STOPS = Counter(
    "stevora_budget_stops",
    "Steps a run's budget stopped, by the limit reached and what followed (fail or pause)",
    ["limit", "action"],
)
WEBHOOK_FAILURES = Counter(
    "stevora_webhook_delivery_failures", "Webhook delivery attempts that failed", ["final"]
)


def run_claimed(dispatched_at: datetime | None, next_run_at: datetime | None) -> None:
    """Queue lag of a claimed run: now minus when it was dispatched or became due, whichever is later."""
    since = max((t for t in (dispatched_at, next_run_at) if t is not None), default=None)
    if since is not None:
        QUEUE_LAG.observe(max(0.0, (utcnow() - since).total_seconds()))


def llm_answered(provider: str, model: str, usage: Usage, cost_usd: float | None) -> None:
    LLM_TOKENS.labels(provider, model, "input").inc(usage.input_tokens)
    LLM_TOKENS.labels(provider, model, "output").inc(usage.output_tokens)
    if cost_usd:
        LLM_COST.labels(provider, model).inc(cost_usd)


def first_token(provider: str, model: str, seconds: float) -> None:
    """Hook for streaming model calls: record the time to the first token when it is known."""
    LLM_TIME_TO_FIRST_TOKEN.labels(provider, model).observe(seconds)


# -- exposition ------------------------------------------------------------------------------------


def _registry() -> CollectorRegistry:
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not path:
        return REGISTRY
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=path)  # type: ignore[no-untyped-call]
    return registry


def exposition() -> tuple[bytes, str]:
    """The text format of every metric of this process (or of all processes sharing the directory)."""
    return generate_latest(_registry()), CONTENT_TYPE_LATEST


def prepare_worker_processes(processes: int) -> None:
    """Before starting several worker processes: give them a shared multiprocess directory."""
    if processes > 1 and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="stevora-metrics-")


def serve_worker_metrics(host: str, port: int) -> WSGIServer | None:
    """Serve `/metrics` on `port` from a background thread (0: do nothing). Returns the server."""
    if not port:
        return None
    server, _thread = start_http_server(port, addr=host, registry=_registry())
    return server


def process_exited(pid: int | None) -> None:
    """Drop a dead worker process's live gauges (multiprocess mode)."""
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if path and pid is not None:
        multiprocess.mark_process_dead(pid, path)  # type: ignore[no-untyped-call]
