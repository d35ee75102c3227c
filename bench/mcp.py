"""The overhead of an MCP tool call over a handler call, per call, in the same run.

    .venv/bin/python -m bench.mcp [--calls 300]

Three sources of the same `echo(text)` tool, each called `--calls` times one after another, as the
tool loop calls them (no database: the trace commit is the same for every source and measured by
bench/tool_loop.py):
* handler — `invoke_tool` on a registered async handler (argument validation, the handler);
* MCP stdio — `tools/call` on this process's session with our counting server (tests/mcp_servers,
  the SDK's MCPServer) over stdio, then the result converted to the trace's output;
* MCP HTTP — the same server over streamable HTTP on loopback.
Arguments are validated against the tool's schema for every source. Printed: mean and p50/p99 per
call, and each MCP transport's overhead over the handler (mean difference).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import MappingProxyType

from stevora.mcp.manager import McpClientManager
from stevora.mcp.results import convert_result
from stevora.tools import ToolContext, ToolRegistry, invoke_tool, schema_problems
from tests.mcp_servers import counting_http, counting_stdio

SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}


async def _timed(call: Callable[[int], Awaitable[object]], calls: int) -> list[float]:
    for i in range(min(20, calls)):  # warm up: sessions started, schemas compiled
        await call(i)
    took = []
    for i in range(calls):
        started = time.perf_counter()
        await call(i)
        took.append((time.perf_counter() - started) * 1000)
    return took


def _line(name: str, ms: list[float], base: float | None) -> str:
    ordered = sorted(ms)
    mean = statistics.fmean(ms)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    extra = "" if base is None else f"   overhead over a handler: {mean - base:+.3f} ms/call"
    return f"{name:<12} mean {mean:7.3f} ms   p50 {statistics.median(ms):7.3f} ms   p99 {p99:7.3f} ms{extra}"


async def main(calls: int) -> None:
    registry = ToolRegistry()

    async def echo(text: str) -> str:
        return text

    registry.register("echo", echo, parameters=SCHEMA)
    ctx = ToolContext(
        idempotency_key="bench:1:0",
        workflow_run_id="wfrun_bench",
        workspace_id="ws_bench",
        step_run_id="srun_bench",
        step_name="agent",
        round=1,
        call_index=0,
        tool_call_id="call_1",
        run_input=MappingProxyType({}),
        state=MappingProxyType({}),
    )

    async def handler_call(i: int) -> object:
        return await invoke_tool(
            registry,
            "echo",
            {"text": f"hi {i}"},
            context=ctx,
            declared_schema=None,
            timeout_s=30,
            max_output_bytes=100_000,
        )

    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "calls.jsonl"
        handler = await _timed(handler_call, calls)
        with counting_http(log) as url:
            from stevora.mcp.config import McpServerConfig

            manager = McpClientManager(
                {"stdio": counting_stdio(log, name="stdio"), "http": McpServerConfig(name="http", url=url)}
            )
            try:
                results = {}
                for name in ("stdio", "http"):
                    conn = manager.connection(name)
                    assert conn is not None

                    async def mcp_call(i: int, conn=conn) -> object:  # type: ignore[no-untyped-def]
                        arguments = {"text": f"hi {i}"}
                        assert not schema_problems(SCHEMA, arguments)
                        result = await conn.call_tool(
                            "echo", arguments, idempotency_key=f"bench:{i}", timeout_s=30
                        )
                        return convert_result(result)

                    results[name] = await _timed(mcp_call, calls)
            finally:
                await manager.close()
    base = statistics.fmean(handler)
    print(f"{calls} sequential calls of echo(text) per source")
    print(_line("handler", handler, None))
    print(_line("MCP stdio", results["stdio"], base))
    print(_line("MCP HTTP", results["http"], base))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    asyncio.run(main(parser.parse_args().calls))
