"""The engine's observation points: one context manager each for a run execution, a step, a model
call and a tool call. Each opens the span (when tracing is on), times the metric and binds the
structlog context (`workflow_run_id`, `step`, `round`) so every log line inside carries it.

The engine calls these in a line or two; everything else about observability lives in this package.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from structlog.contextvars import bind_contextvars, bound_contextvars

from stevora.observability import metrics, tracing

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from stevora.llm.messages import LlmResponse, Usage
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


class ModelCallObservation:
    """One provider call (a context manager); call `.answered(response)` when it returns.

    Class-based, not a generator: this runs on every model call. With tracing off it sets the
    structlog `round` (one context-variable write), times the call and observes the histogram
    child bound for the step visit (`ModelCalls`); the span exists only with tracing on. The span
    names the model; `model` here is the metric label (bounded: `metrics.model_label`)."""

    __slots__ = ("_children", "_round", "_scope", "_token", "model", "provider", "span", "started", "status")

    def __init__(
        self,
        children: _ModelChildren,
        provider: str,
        model: str,
        step_run_id: str,
        round_: int,
        messages: Any,
    ) -> None:
        self.provider = provider
        self.model = children.label  # the metric label, not the step's string
        self.span: Span | None = None
        self.started = 0.0
        self.status = "error"
        self._children = children
        self._round = round_
        self._scope: Any = None
        if tracing._state.tracer is not None:  # tracing on (tracing.is_on(), without the call)
            self._scope = tracing.chat_span(provider, model, step_run_id, round_, messages)

    def __enter__(self) -> ModelCallObservation:
        self._token = _ROUND.set(self._round)
        if self._scope is not None:
            try:
                self.span = self._scope.__enter__()
            except BaseException:
                _ROUND.reset(self._token)
                raise
        self.started = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            children = self._children
            (children.ok if self.status == "ok" else children.error).observe(
                time.perf_counter() - self.started
            )
            if self._scope is not None:
                self._scope.__exit__(*exc)
        finally:
            _ROUND.reset(self._token)

    def answered(self, response: LlmResponse) -> None:
        self.status = "ok"
        if self.span is not None:
            tracing.chat_answered(self.span, response)

    def first_token(self) -> None:
        """Streaming calls: the first token arrived (time to first token)."""
        seconds = time.perf_counter() - self.started
        metrics.first_token(self.provider, self.model, seconds)
        tracing.chat_first_token(self.span, seconds)


class _ModelChildren:
    """The metric label of one (provider, model) and its children, bound once per step visit
    (the token and cost children when first needed: a series appears when it is first counted)."""

    __slots__ = ("cost", "error", "label", "ok", "provider", "tokens")

    def __init__(self, provider: str, label: str) -> None:
        self.provider = provider
        self.label = label
        self.error = metrics.bound_histogram(metrics.LLM_CALL_DURATION, provider, label, "error")
        self.ok = metrics.bound_histogram(metrics.LLM_CALL_DURATION, provider, label, "ok")
        # (input, output, cache_read, cache_write, reasoning): the cache kinds are parts of
        # `input`, reasoning (and thinking) a part of `output`
        self.tokens: tuple[metrics.BoundCounter, ...] | None = None
        self.cost: metrics.BoundCounter | None = None

    def answered(self, usage: Usage, cost_usd: float | None) -> None:
        tokens = self.tokens
        if tokens is None:
            tokens = self.tokens = tuple(
                metrics.bound_counter(metrics.LLM_TOKENS, self.provider, self.label, kind)
                for kind in metrics.TOKEN_KINDS
            )
        tokens[0].inc(usage.input_tokens)
        tokens[1].inc(usage.output_tokens)
        if usage.cache_read_tokens:
            tokens[2].inc(usage.cache_read_tokens)
        if usage.cache_write_tokens:
            tokens[3].inc(usage.cache_write_tokens)
        if usage.reasoning_tokens:
            tokens[4].inc(usage.reasoning_tokens)
        if cost_usd:
            if self.cost is None:
                self.cost = metrics.bound_counter(metrics.LLM_COST, self.provider, self.label)
            self.cost.inc(cost_usd)


class ModelCalls:
    """The observation points of one step visit's model calls: the metric label and children of
    each (provider, model) are looked up once per visit, not per call. `known_name` is
    `Pricing.known_name`: the label is the price list's name or `other` (`metrics.model_label`)."""

    __slots__ = ("_children", "_known_name", "step_run_id")

    def __init__(self, step_run_id: str, known_name: Callable[[str, str], str | None] | None = None) -> None:
        self.step_run_id = step_run_id
        self._known_name = known_name
        self._children: dict[tuple[str, str], _ModelChildren] = {}  # by (provider, model)

    def _bind(self, provider: str, model: str) -> _ModelChildren:
        known = self._known_name(provider, model) if self._known_name is not None else None
        found = self._children[(provider, model)] = _ModelChildren(provider, metrics.model_label(known))
        return found

    def label(self, provider: str, model: str) -> str:
        """The `model` label of `model` (the price list's name or `other`)."""
        return (self._children.get((provider, model)) or self._bind(provider, model)).label

    def call(self, provider: str, model: str, round_: int, messages: Any) -> ModelCallObservation:
        """`with calls.call(...) as obs:` around one provider call."""
        children = self._children.get((provider, model)) or self._bind(provider, model)
        return ModelCallObservation(children, provider, model, self.step_run_id, round_, messages)

    def answered(self, provider: str, model: str, usage: Usage, cost_usd: float | None) -> None:
        """Tokens and cost of an answered call (`metrics.llm_answered`, children bound per visit)."""
        (self._children.get((provider, model)) or self._bind(provider, model)).answered(usage, cost_usd)


def rate_limit_waited(provider: str, label: str, wait_s: float, outcome: str) -> None:
    """A model call's turn under the provider rate limits: the metric and, for a call sent, the
    `stevora.rate_limit.wait_ms` attribute of its `chat` span (`label`: `metrics.model_label`)."""
    metrics.LLM_RATE_LIMIT_WAIT.labels(provider, label, outcome).observe(wait_s)
    if outcome == "sent":
        tracing.current_span_attribute("stevora.rate_limit.wait_ms", round(wait_s * 1000, 3))


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
    """One provider call outside a step visit's `ModelCalls`; call `.answered(response)`. The span
    names `model`; the metrics name `known_model` (`Pricing.known_name`) or `other`."""
    with ModelCalls(step_run_id, lambda _p, _m: known_model).call(provider, model, round_, messages) as obs:
        yield obs


class ToolCallObservation:
    """One tool handler call (a context manager); call `.finished(outcome)` with its ToolOutcome.
    Class-based for the same reason as `ModelCallObservation`; sets the structlog `tool` (and
    `round`) for the call's log lines."""

    __slots__ = ("_calls", "_round", "_round_token", "_scope", "_tool_token", "name", "span")

    def __init__(
        self, calls: ToolCalls, name: str, call_id: str | None, round_: int | None, arguments: Any
    ) -> None:
        self.name = name
        self.span: Span | None = None
        self._calls = calls
        self._round = round_
        self._scope: Any = None
        if tracing._state.tracer is not None:
            self._scope = tracing.tool_span(name, call_id, calls.step_run_id, round_, arguments)

    def __enter__(self) -> ToolCallObservation:
        self._tool_token = _TOOL.set(self.name)
        self._round_token = None if self._round is None else _ROUND.set(self._round)
        if self._scope is not None:
            try:
                self.span = self._scope.__enter__()
            except BaseException:
                self._reset()
                raise
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._scope is None:  # `_reset`, inlined: tracing off
            if self._round_token is not None:
                _ROUND.reset(self._round_token)
            _TOOL.reset(self._tool_token)
            return
        try:
            self._scope.__exit__(*exc)
        finally:
            self._reset()

    def _reset(self) -> None:
        if self._round_token is not None:
            _ROUND.reset(self._round_token)
        _TOOL.reset(self._tool_token)

    def finished(self, outcome: ToolOutcome) -> None:
        if self.span is not None:
            tracing.tool_finished(self.span, outcome)
        if outcome.status == "completed":
            durations = self._calls._durations
            found = durations.get(self.name) or self._calls.durations(self.name)
            found[1].observe(outcome.duration_ms / 1000)
            return
        # Bounded: the registered handler's name, or `other` when no handler had that name.
        label = metrics.tool_label(self.name, outcome.error_code)
        self._calls.durations(label)[0].observe(outcome.duration_ms / 1000)
        metrics.TOOL_CALL_ERRORS.labels(label, outcome.error_code or "TOOL_ERROR").inc()


class ToolCalls:
    """The observation points of one step visit's tool calls (metric children bound per visit)."""

    __slots__ = ("_durations", "step_run_id")

    def __init__(self, step_run_id: str) -> None:
        self.step_run_id = step_run_id
        # tool label -> (failed, completed) duration children
        self._durations: dict[str, tuple[metrics.BoundHistogram, metrics.BoundHistogram]] = {}

    def call(self, name: str, call_id: str | None, round_: int | None, arguments: Any) -> ToolCallObservation:
        """`with calls.call(...) as obs:` around one tool handler call."""
        return ToolCallObservation(self, name, call_id, round_, arguments)

    def durations(self, label: str) -> tuple[metrics.BoundHistogram, metrics.BoundHistogram]:
        found = self._durations.get(label)
        if found is None:
            found = self._durations[label] = (
                metrics.bound_histogram(metrics.TOOL_CALL_DURATION, label, "failed"),
                metrics.bound_histogram(metrics.TOOL_CALL_DURATION, label, "completed"),
            )
        return found


@contextmanager
def tool_call(
    name: str, call_id: str | None, step_run_id: str, round_: int | None, arguments: Any
) -> Iterator[ToolCallObservation]:
    """One tool handler call outside a step visit's `ToolCalls`; call `.finished(outcome)`."""
    with ToolCalls(step_run_id).call(name, call_id, round_, arguments) as obs:
        yield obs


def _structlog_var(key: str) -> ContextVar[Any]:
    """The context variable structlog's `bind_contextvars(key=...)` writes (created if new):
    setting it directly is what binding does, without scanning the whole context."""
    token = bind_contextvars(**{key: ...})[key]  # Ellipsis: structlog's "not bound"
    var: ContextVar[Any] = token.var
    var.reset(token)
    return var


_ROUND = _structlog_var("round")
_TOOL = _structlog_var("tool")
