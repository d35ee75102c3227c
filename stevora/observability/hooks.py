"""The engine's observation points: one context manager each for a run execution, a step, a model
call and a tool call. Each opens the span (when tracing is on), times the metric and binds the
structlog context (`workflow_run_id`, `step`, `round`) so every log line inside carries it.

The engine calls these in a line or two; everything else about observability lives in this package.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from structlog.contextvars import bound_contextvars

from stevora.observability import metrics, tracing

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from stevora.llm.messages import LlmResponse
    from stevora.tools import ToolOutcome


@contextmanager
def run_execution(run: Mapping[str, Any], workflow_name: str, worker_id: str) -> Iterator[None]:
    """A worker executing a claimed run (`run` is the claimed row), until it no longer needs it."""
    metrics.run_claimed(run.get("dispatched_at"), run.get("next_run_at"))
    metrics.RUNS_IN_FLIGHT.inc()
    try:
        with bound_contextvars(workflow_run_id=run["id"]), tracing.run_span(run, workflow_name, worker_id):
            yield
    finally:
        metrics.RUNS_IN_FLIGHT.dec()


@dataclass
class StepObservation:
    status: str = "failed"  # what an exception out of the step means


@contextmanager
def step(
    run_id: str, step_run_id: str, step_name: str, step_type: str, attempt: int
) -> Iterator[StepObservation]:
    """One execution of a step; set `.status` to the StepResult's status."""
    obs = StepObservation()
    started = time.perf_counter()
    try:
        with (
            bound_contextvars(step=step_name, attempt=attempt),
            tracing.step_span(run_id, step_run_id, step_name, step_type, attempt) as span,
        ):
            yield obs
            if span is not None:
                span.set_attribute("stevora.step.status", obs.status)
    finally:
        metrics.STEP_DURATION.labels(step_type, obs.status).observe(time.perf_counter() - started)


@dataclass
class ModelCallObservation:
    provider: str
    model: str  # the metric label (bounded), not necessarily the model the step named
    span: Span | None
    started: float
    status: str = "error"

    def answered(self, response: LlmResponse) -> None:
        self.status = "ok"
        tracing.chat_answered(self.span, response)

    def first_token(self) -> None:
        """Streaming calls: the first token arrived (time to first token)."""
        seconds = time.perf_counter() - self.started
        metrics.first_token(self.provider, self.model, seconds)
        tracing.chat_first_token(self.span, seconds)


@contextmanager
def model_call(
    provider: str,
    model: str,
    step_run_id: str,
    round_: int,
    messages: Any,
    *,
    known_model: str | None = None,
) -> Iterator[ModelCallObservation]:
    """One provider call; call `.answered(response)` when it returns. The span names `model`;
    the metrics name `known_model` (`Pricing.known_name`) or `other`, never the step's string."""
    with (
        bound_contextvars(round=round_),
        tracing.chat_span(provider, model, step_run_id, round_, messages) as span,
    ):
        obs = ModelCallObservation(provider, metrics.model_label(known_model), span, time.perf_counter())
        try:
            yield obs
        finally:
            metrics.LLM_CALL_DURATION.labels(provider, obs.model, obs.status).observe(
                time.perf_counter() - obs.started
            )


@dataclass
class ToolCallObservation:
    name: str
    span: Span | None

    def finished(self, outcome: ToolOutcome) -> None:
        tracing.tool_finished(self.span, outcome)
        label = metrics.tool_label(self.name, outcome.error_code)
        metrics.TOOL_CALL_DURATION.labels(label, outcome.status).observe(outcome.duration_ms / 1000)
        if not outcome.ok:
            metrics.TOOL_CALL_ERRORS.labels(label, outcome.error_code or "TOOL_ERROR").inc()


@contextmanager
def tool_call(
    name: str, call_id: str | None, step_run_id: str, round_: int | None, arguments: Any
) -> Iterator[ToolCallObservation]:
    """One tool handler call; call `.finished(outcome)` with its ToolOutcome."""
    binding = {"tool": name} if round_ is None else {"tool": name, "round": round_}
    with (
        bound_contextvars(**binding),
        tracing.tool_span(name, call_id, step_run_id, round_, arguments) as span,
    ):
        yield ToolCallObservation(name, span)
