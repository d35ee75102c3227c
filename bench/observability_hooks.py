"""CPU cost of the engine's observation points per tool-loop round (one model call, one tool call).

    .venv/bin/python -m bench.observability_hooks

Pure CPU, no I/O: the hooks the loop runs per round (`hooks.model_call` + `answered`,
`hooks.tool_call` + `finished`), with tracing off (the default: metrics and log context only) and
on (an SDK tracer provider with a BatchSpanProcessor whose exporter drops the spans). Compare with
the per-round overhead of `bench/tool_loop.py` (docs/benchmarks.md).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from stevora.llm.messages import LlmResponse, Message, Usage
from stevora.observability import hooks, tracing
from stevora.tools import ToolOutcome


class _Drop(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def _round(response: LlmResponse, outcome: ToolOutcome, messages: list[Message]) -> None:
    with hooks.model_call("openai", "gpt-4o-mini", "srun_x", 1, messages) as call:
        call.answered(response)
    with hooks.tool_call("lookup", "call_1", "srun_x", 1, '{"city": "Paris"}') as tool:
        tool.finished(outcome)


def measure(n: int = 20_000) -> float:
    """Microseconds per round (best of 3)."""
    response = LlmResponse("ok", [], Usage(10, 5), "gpt-4o-mini", "stop", "resp_1", "openai")
    outcome = ToolOutcome("completed", {}, {"ok": True}, None, None, 0.1, '{"ok": true}')
    messages = [Message.user("hello")]
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        for _ in range(n):
            _round(response, outcome, messages)
        best = min(best, (time.perf_counter() - started) / n * 1e6)
    return best


if __name__ == "__main__":
    off = measure()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(_Drop(), max_queue_size=100_000))
    tracing.use_provider(provider)
    on = measure(5_000)
    tracing.use_provider(provider, capture_content=True)
    content = measure(5_000)
    provider.shutdown()
    print("observation points per tool-loop round (one model call + one tool call), CPU only")
    print(f"  tracing off (metrics + log context): {off:.1f} µs")
    print(f"  tracing on:                          {on:.1f} µs")
    print(f"  tracing on, content captured:        {content:.1f} µs")
