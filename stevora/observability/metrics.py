"""Prometheus metrics (prometheus-client): what the API's `/metrics` and a worker's metrics port serve.

The metric objects live in prometheus-client's process-wide registry, as that library intends:
the embedded `stevora dev` process (API and worker in one) then shows both sides on one
`/metrics`. With several worker processes (`stevora worker --processes N`) each child writes its
values to files in `PROMETHEUS_MULTIPROC_DIR` and the parent serves their sum (prometheus-client's
multiprocess mode; the directory must be set before the children start, which `serve_worker_metrics`
does). Names and example PromQL: docs/observability.md.

Labels are bounded and never tenant-chosen: a workspace writes model, step, definition and tool
names, and `/metrics` is read by whoever operates Prometheus (and is often less protected than the
API). So `model` is the price list's name for a priced model or `other`, `tool` is a handler the
worker registered or `other`, and nothing else carries a name: statuses, step types, providers
(configured by the operator) and error codes come from fixed sets.
"""

from __future__ import annotations

import hmac
import os
import socket
import tempfile
import threading
from bisect import bisect_left
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    make_wsgi_app,
    multiprocess,
)
from prometheus_client.exposition import ThreadingWSGIServer

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
LLM_TOKENS = Counter(
    "stevora_llm_tokens",
    "Tokens used by model calls (kind: input, output, the parts of input read from and written "
    "to the provider's prompt cache, and the part of output spent on reasoning or thinking)",
    ["provider", "model", "kind"],
)
TOKEN_KINDS = ("input", "output", "cache_read", "cache_write", "reasoning")
LLM_COST = Counter("stevora_llm_cost_usd", "Cost of model calls in USD", ["provider", "model"])
LLM_RATE_LIMIT_WAIT = Histogram(
    "stevora_llm_rate_limit_wait_seconds",
    "Time a model call waited for its turn under STEVORA_RATE_LIMITS (outcome: sent, or refused "
    "when the turn was beyond the bound)",
    ["provider", "model", "outcome"],
    buckets=_FAST,
)
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
# Triggers (docs/triggers.md)
SCHEDULE_TICKS = Counter(
    "stevora_schedule_ticks", "Schedule ticks, by outcome (run, skipped, late)", ["outcome"]
)
TRIGGER_EVENTS = Counter(
    "stevora_trigger_events",
    "Events received (POST /v1/events and inbound hooks), by outcome (received, deduplicated)",
    ["outcome"],
)
TRIGGER_RUNS_STARTED = Counter(
    "stevora_trigger_runs_started", "Runs started by triggers, by source (schedule, event)", ["source"]
)
BUDGET_STOPS = Counter(
    "stevora_budget_stops",
    "Steps a run's budget stopped, by the limit reached and what followed (fail or pause)",
    ["limit", "action"],
)
WEBHOOK_FAILURES = Counter(
    "stevora_webhook_delivery_failures", "Webhook delivery attempts that failed", ["final"]
)
# MCP servers (docs/mcp.md): `server` is a worker's own server (named by the operator in its
# mcpServers file) or `workspace` for every server a workspace registered through the API.
MCP_CALLS = Counter("stevora_mcp_calls", "MCP tool calls, by server and outcome", ["server", "status"])
MCP_CALL_DURATION = Histogram(
    "stevora_mcp_call_duration_seconds",
    "MCP tool call latency (tools/call round trip)",
    ["server"],
    buckets=_FAST,
)
MCP_RESTARTS = Counter(
    "stevora_mcp_server_restarts", "MCP server sessions started again after a crash", ["server"]
)


OTHER = "other"
# A call that named no registered handler: its name came from the model or the definition.
_UNREGISTERED_TOOL_CODES = frozenset({"TOOL_NOT_REGISTERED", "TOOL_NOT_OFFERED"})


def model_label(known_name: str | None) -> str:
    """The `model` label: the price list's name for the model (`Pricing.known_name`), else `other`."""
    return known_name or OTHER


def tool_label(name: str, error_code: str | None) -> str:
    """The `tool` label: the registered handler's name; `other` when no handler had that name."""
    return OTHER if error_code in _UNREGISTERED_TOOL_CODES else name


def run_claimed(dispatched_at: datetime | None, next_run_at: datetime | None) -> None:
    """Queue lag of a claimed run: now minus when it was dispatched or became due, whichever is later."""
    since = max((t for t in (dispatched_at, next_run_at) if t is not None), default=None)
    if since is not None:
        QUEUE_LAG.observe(max(0.0, (utcnow() - since).total_seconds()))


def llm_answered(provider: str, known_model: str | None, usage: Usage, cost_usd: float | None) -> None:
    """Tokens and cost of one answered call; `known_model` as `Pricing.known_name` gives it."""
    model = model_label(known_model)
    LLM_TOKENS.labels(provider, model, "input").inc(usage.input_tokens)
    LLM_TOKENS.labels(provider, model, "output").inc(usage.output_tokens)
    if usage.cache_read_tokens:
        LLM_TOKENS.labels(provider, model, "cache_read").inc(usage.cache_read_tokens)
    if usage.cache_write_tokens:
        LLM_TOKENS.labels(provider, model, "cache_write").inc(usage.cache_write_tokens)
    if usage.reasoning_tokens:
        LLM_TOKENS.labels(provider, model, "reasoning").inc(usage.reasoning_tokens)
    if cost_usd:
        LLM_COST.labels(provider, model).inc(cost_usd)


# -- children bound for a hot path -----------------------------------------------------------------
#
# A step visit binds its metric children once (observability/hooks.py) and observes them on every
# model and tool call. prometheus-client's `Counter.inc` and `Histogram.observe` check, per call,
# that the child has all its labels (three Python calls) and a histogram walks its buckets in
# Python; a child bound with all its labels passes that check for ever. These wrappers go to the
# child's values directly: the same values, in process and in multiprocess mode (the values are
# prometheus-client's own, `MutexValue` or `MultiProcessValue`), tested against the library's
# own methods in tests/unit/observability/test_bound_metrics.py.


class BoundCounter:
    """A labelled `Counter` child's `inc`, without the per-call label check."""

    __slots__ = ("_inc",)

    def __init__(self, child: Counter) -> None:
        self._inc = child._value.inc

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self._inc(amount)


class BoundHistogram:
    """A labelled `Histogram` child's `observe` (no exemplar), its bucket found by bisection."""

    __slots__ = ("_bounds", "_buckets", "_sum")

    def __init__(self, child: Histogram) -> None:
        self._sum = child._sum.inc
        self._bounds: list[float] = list(child._upper_bounds)  # ends with +Inf
        self._buckets = [bucket.inc for bucket in child._buckets]

    def observe(self, amount: float) -> None:
        self._sum(amount)
        if amount == amount:  # NaN falls in no bucket, as with `Histogram.observe`
            self._buckets[bisect_left(self._bounds, amount)](1)


def bound_counter(metric: Counter, *labels: str) -> BoundCounter:
    return BoundCounter(metric.labels(*labels))


def bound_histogram(metric: Histogram, *labels: str) -> BoundHistogram:
    return BoundHistogram(metric.labels(*labels))


def first_token(provider: str, model: str, seconds: float) -> None:
    """Hook for streaming model calls: record the time to the first token when it is known
    (`model` is already a label: see `model_label`)."""
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


def authorized(token: str | None, authorization: str | None) -> bool:
    """Whether a request may read `/metrics`: always without a configured `token`
    (STEVORA_METRICS_TOKEN), else only with `Authorization: Bearer <token>`."""
    if not token:
        return True
    scheme, _, given = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


UNAUTHORIZED_HEADERS = {"WWW-Authenticate": 'Bearer realm="metrics"'}


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def serve_worker_metrics(host: str, port: int, token: str | None = None) -> WSGIServer | None:
    """Serve `/metrics` on `port` from a background thread (0: do nothing). Returns the server.

    With `token`, a scrape must send `Authorization: Bearer <token>` (401 otherwise)."""
    if not port:
        return None
    exposition_app = make_wsgi_app(_registry())

    def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        if not authorized(token, environ.get("HTTP_AUTHORIZATION")):
            start_response(
                "401 Unauthorized", [*UNAUTHORIZED_HEADERS.items(), ("Content-Type", "text/plain")]
            )
            return [b"Unauthorized: send Authorization: Bearer <STEVORA_METRICS_TOKEN>\n"]
        return exposition_app(environ, start_response)  # type: ignore[no-any-return]

    class Server(ThreadingWSGIServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    server = make_server(host, port, app, Server, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="stevora-metrics", daemon=True).start()
    return server


def process_exited(pid: int | None) -> None:
    """Drop a dead worker process's live gauges (multiprocess mode)."""
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if path and pid is not None:
        multiprocess.mark_process_dead(pid, path)  # type: ignore[no-untyped-call]
