"""`bench/tool_loop.py` with OpenTelemetry tracing on: the cost of the spans per round.

    .venv/bin/python -m bench.tool_loop_otel [--rounds 20] [--repeats 10] [--capture-content] [--off]

Installs an SDK tracer provider with a BatchSpanProcessor (as `STEVORA_OTEL=true` does) whose
exporter drops the spans, so the figure is Stevora's instrumentation plus the SDK's span
handling, not a collector's network I/O. `--off` runs the same bench with tracing off (as
`python -m bench.tool_loop`, in its own database) for the comparison.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from bench.common import bench_database_url
from bench.tool_loop import main
from stevora.observability import tracing


class DroppingExporter(SpanExporter):
    def __init__(self) -> None:
        self.exported = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.exported += len(spans)
        return SpanExportResult.SUCCESS


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--capture-content", action="store_true")
    parser.add_argument("--off", action="store_true", help="tracing off: the baseline")
    args = parser.parse_args()
    if args.off:
        asyncio.run(main(bench_database_url("tool_loop_otel_off"), args.rounds, args.repeats))
        raise SystemExit(0)
    exporter = DroppingExporter()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    tracing.use_provider(provider, capture_content=args.capture_content)
    asyncio.run(main(bench_database_url("tool_loop_otel"), args.rounds, args.repeats))
    provider.shutdown()
    print(f"  spans exported: {exporter.exported}")
