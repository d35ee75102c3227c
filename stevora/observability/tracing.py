"""OpenTelemetry spans following the GenAI semantic conventions, and one trace per run.

Optional: needs the `stevora[otel]` extra and is on when `OTEL_EXPORTER_OTLP_ENDPOINT` or
`STEVORA_OTEL=true` is set. Off, every helper here is a `nullcontext` behind one `None` check,
so the hot path pays nothing measurable (docs/benchmarks.md).

The trace of a run: the API's `create_run` span is its root; its W3C context is stored on the run
(`workflow_runs.trace_context`), and every worker execution of the run (first claim, each resume
after a wait, a retry, a crash recovery) starts its `run` span as a child of it. Below it:
`step <name>` per step execution, `chat <model>` per model call, `execute_tool <name>` per tool call.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

    from stevora.settings import Settings

log = logging.getLogger("stevora.observability")

INSTRUMENTATION = "stevora"


@dataclass
class _Tracing:
    tracer: Tracer | None = None  # None: tracing is off
    capture_content: bool = False
    provider: TracerProvider | None = field(default=None, repr=False)


# The process's tracer, set once at the process edge (like the OpenTelemetry global it wraps).
_state = _Tracing()


def is_on() -> bool:
    """Whether this process traces (a tracer is installed)."""
    return _state.tracer is not None


def enabled(settings: Settings) -> bool:
    return settings.otel or bool(settings.otel_exporter_otlp_endpoint)


def configure_tracing(settings: Settings) -> bool:
    """Install an OTLP-exporting tracer provider when tracing is enabled. True when on."""
    if _state.tracer is not None or not enabled(settings):
        return _state.tracer is not None
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning("STEVORA_OTEL is set but OpenTelemetry is not installed: pip install 'stevora[otel]'")
        return False
    # The exporter reads OTEL_EXPORTER_OTLP_* itself (endpoint, headers, protocol defaults).
    provider = TracerProvider(resource=Resource.create({"service.name": "stevora"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    use_provider(provider, capture_content=settings.otel_capture_content)
    return True


def use_provider(provider: TracerProvider | None, *, capture_content: bool = False) -> None:
    """Trace through `provider` (tests pass one with an in-memory exporter); None turns tracing off."""
    _state.provider = provider
    _state.tracer = provider.get_tracer(INSTRUMENTATION) if provider is not None else None
    _state.capture_content = capture_content


def shutdown_tracing() -> None:
    if _state.provider is not None:
        _state.provider.force_flush()


# -- the run's trace -------------------------------------------------------------------------------


@dataclass
class NewRunTrace:
    """The `create_run` span of the API; `carrier` (W3C headers) is stored on the run."""

    carrier: dict[str, str] | None = None
    span: Span | None = None

    def created(self, run_id: str | None) -> None:
        if self.span is not None and run_id is not None:
            self.span.set_attribute("stevora.workflow_run.id", run_id)


@contextmanager
def run_created(workspace_id: str, definition_id: str) -> Iterator[NewRunTrace]:
    tracer = _state.tracer
    if tracer is None:
        yield NewRunTrace()
        return
    from opentelemetry.propagate import inject

    with tracer.start_as_current_span(
        "create_run",
        attributes={"stevora.workspace.id": workspace_id, "stevora.workflow_definition.id": definition_id},
    ) as span:
        carrier: dict[str, str] = {}
        inject(carrier)
        yield NewRunTrace(carrier, span)


# In a fork's stored trace context: the origin's `traceparent`, so every span the fork's run makes
# links to the origin's trace (trace ids are random, not derived from run ids: the link is stored).
ORIGIN_KEY = "stevora-origin-traceparent"


@contextmanager
def run_forked(
    workspace_id: str, origin_id: str, origin_context: Mapping[str, str] | None
) -> Iterator[NewRunTrace]:
    """The `fork_run` span of a fork or replay: the root of the new run's trace, with a link to
    the origin's root span when the origin was traced; its carrier (stored on the new run) keeps
    the origin's `traceparent` under ORIGIN_KEY, so the new run's `run` spans carry the link too."""
    tracer = _state.tracer
    if tracer is None:
        yield NewRunTrace()
        return
    from opentelemetry.propagate import inject

    origin = (origin_context or {}).get("traceparent")
    with tracer.start_as_current_span(
        "fork_run",
        links=_origin_links(origin),
        attributes={"stevora.workspace.id": workspace_id, "stevora.workflow_run.forked_from": origin_id},
    ) as span:
        carrier: dict[str, str] = {}
        inject(carrier)
        if origin:
            carrier[ORIGIN_KEY] = origin
        yield NewRunTrace(carrier, span)


def _origin_links(traceparent: str | None) -> list[Any]:
    if not traceparent:
        return []
    from opentelemetry.propagate import extract
    from opentelemetry.trace import Link, get_current_span

    context = get_current_span(extract({"traceparent": traceparent})).get_span_context()
    return [Link(context, {"stevora.link": "forked_from"})] if context.is_valid else []


def current_carrier() -> dict[str, str] | None:
    """The W3C context of the current span (a child run joins its parent's trace), else None."""
    if _state.tracer is None:
        return None
    from opentelemetry.propagate import inject

    carrier: dict[str, str] = {}
    inject(carrier)
    return carrier or None


@contextmanager
def run_span(run: Mapping[str, Any], workflow_name: str, worker_id: str) -> Iterator[None]:
    """One worker execution of a run, a child of the context stored when the run was created."""
    tracer = _state.tracer
    if tracer is None:
        yield
        return
    from opentelemetry.propagate import extract

    stored = run.get("trace_context")
    parent = extract(stored) if stored else None
    with tracer.start_as_current_span(
        f"run {workflow_name}",
        context=parent,
        links=_origin_links(stored.get(ORIGIN_KEY)) if stored else None,
        attributes={
            "stevora.workflow_run.id": run["id"],
            "stevora.workspace.id": run["workspace_id"],
            "stevora.workflow.name": workflow_name,
            "stevora.worker.id": worker_id,
        },
    ):
        yield


@contextmanager
def step_span(
    run_id: str, step_run_id: str, step_name: str, step_type: str, attempt: int
) -> Iterator[Span | None]:
    tracer = _state.tracer
    if tracer is None:
        yield None
        return
    with tracer.start_as_current_span(
        f"step {step_name}",
        attributes={
            "stevora.workflow_run.id": run_id,
            "stevora.step_run.id": step_run_id,
            "stevora.step.name": step_name,
            "stevora.step.type": step_type,
            "stevora.step.attempt": attempt,
        },
    ) as span:
        yield span


@contextmanager
def chat_span(
    provider: str, model: str, step_run_id: str, round_: int, messages: Any
) -> Iterator[Span | None]:
    tracer = _state.tracer
    if tracer is None:
        yield None
        return
    from opentelemetry.trace import SpanKind

    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": provider,
        "gen_ai.request.model": model,
        "stevora.step_run.id": step_run_id,
        "stevora.llm.round": round_,
    }
    if _state.capture_content:
        attributes["gen_ai.input.messages"] = _json([m.to_dict() for m in messages])
    with tracer.start_as_current_span(f"chat {model}", kind=SpanKind.CLIENT, attributes=attributes) as span:
        yield span


def current_span_attribute(key: str, value: Any) -> None:
    """Set an attribute on the current span (the `chat` span around a provider call), if tracing is on."""
    if _state.tracer is None:
        return
    from opentelemetry import trace

    trace.get_current_span().set_attribute(key, value)


def chat_first_token(span: Span | None, seconds: float) -> None:
    """A streamed call's time to first token, on its `chat` span (and as a span event)."""
    if span is None:
        return
    span.set_attribute("stevora.llm.time_to_first_token_ms", round(seconds * 1000, 3))
    span.add_event("gen_ai.first_token")


def chat_answered(span: Span | None, response: Any) -> None:
    """Response attributes of a `chat` span (`response` is an `LlmResponse`)."""
    if span is None:
        return
    span.set_attribute("gen_ai.response.model", response.model or "")
    span.set_attribute("gen_ai.usage.input_tokens", response.usage.input_tokens)
    span.set_attribute("gen_ai.usage.output_tokens", response.usage.output_tokens)
    # The GenAI conventions' prompt-cache attributes (parts of input_tokens).
    span.set_attribute("gen_ai.usage.cache_read.input_tokens", response.usage.cache_read_tokens)
    span.set_attribute("gen_ai.usage.cache_creation.input_tokens", response.usage.cache_write_tokens)
    # The part of output_tokens spent on reasoning (OpenAI) or thinking (Anthropic), by the name
    # of the installed semantic-conventions package (GEN_AI_USAGE_REASONING_OUTPUT_TOKENS).
    span.set_attribute("gen_ai.usage.reasoning.output_tokens", response.usage.reasoning_tokens)
    if response.finish_reason:
        span.set_attribute("gen_ai.response.finish_reasons", [response.finish_reason])
    if response.response_id:
        span.set_attribute("gen_ai.response.id", response.response_id)
    if _state.capture_content:
        span.set_attribute(
            "gen_ai.output.messages",
            _json(
                [
                    {
                        "role": "assistant",
                        "text": response.text,
                        "toolCalls": [c.to_dict() for c in response.tool_calls],
                    }
                ]
            ),
        )


@contextmanager
def tool_span(
    name: str, call_id: str | None, step_run_id: str, round_: int | None, arguments: Any
) -> Iterator[Span | None]:
    tracer = _state.tracer
    if tracer is None:
        yield None
        return
    from opentelemetry.trace import SpanKind

    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": name,
        "gen_ai.tool.type": "function",
        "stevora.step_run.id": step_run_id,
    }
    if call_id is not None:
        attributes["gen_ai.tool.call.id"] = call_id
    if round_ is not None:
        attributes["stevora.llm.round"] = round_
    if _state.capture_content:
        attributes["gen_ai.tool.call.arguments"] = (
            arguments if isinstance(arguments, str) else _json(arguments)
        )
    with tracer.start_as_current_span(
        f"execute_tool {name}", kind=SpanKind.INTERNAL, attributes=attributes
    ) as span:
        yield span


def tool_finished(span: Span | None, outcome: Any) -> None:
    """Result attributes of an `execute_tool` span (`outcome` is a `ToolOutcome`)."""
    if span is None:
        return
    if not outcome.ok:
        from opentelemetry.trace import Status, StatusCode

        span.set_attribute("error.type", outcome.error_code or "TOOL_ERROR")
        span.set_status(Status(StatusCode.ERROR, outcome.error))
    if _state.capture_content:
        span.set_attribute("gen_ai.tool.call.result", outcome.result_text)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)
