"""Long-horizon runs: input tokens, the cached share and the cost of a run of hundreds of rounds.

    .venv/bin/python -m bench.long_horizon [--rounds 500] [--providers openai anthropic]
                                           [--modes cached uncached trimmed compacted]

One `llm` step calls a `lookup` tool once per round for `--rounds` rounds, through the real SDKs,
against the loopback fake with its prefix cache on (stevora/testing/fake_prompt_cache.py: each
provider's documented caching; the fake runs in its own process, so the worker's CPU is Stevora's
and the SDK's only). Modes: `cached` (the default step), `uncached` (`cache: false`), `trimmed`
(`context: trim_tool_results` with a window that the full transcript exceeds about halfway),
`compacted` (`context: compact`, `keepLastRounds: 20`, with a window the full transcript exceeds
about a fifth of the way in: a summarising model call every ~80 rounds; `cached` is its baseline
without compaction).
Printed per provider and mode:

* input tokens per round and the cached share, at rounds 1, 2, 3, 100 and the last; the share of
  all input tokens from round 3 on that were cache reads (target: 90 %);
* the run's cost from the price catalogue (cache reads and writes at their own prices), and
  cached / uncached (target: at most a third);
* per-round worker CPU (outside the provider call: checkpoint, tool, transcript; inside it: the
  SDK encoding the growing request and parsing the answer) and the storage the round added
  (its `llm_calls` and `tool_trace` rows) at rounds 1, 100 and the last;
* with `compacted`: the compactions (round, tokens before and after, cost) and the input tokens
  per round around them (the prefix cache is written again once after each);
* the cached share of the first request after a simulated crash: the step fails at round
  `rounds/2` (a 503) and its retry rebuilds the transcript from the rows; the rebuilt request
  reads the prefix the lost one wrote.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import re
import time
from multiprocessing.connection import Connection
from typing import Any

import anthropic
import openai

from bench.common import bench_database_url, new_workspace
from stevora.engine import commands
from stevora.engine.inline import InlineDispatcher
from stevora.engine.run_pool import RunPool
from stevora.llm.anthropic_provider import AnthropicProvider
from stevora.llm.messages import LlmRequest, LlmResponse, Usage
from stevora.llm.openai_provider import OpenAIProvider
from stevora.llm.router import ProviderRouter
from stevora.logging import configure_logging
from stevora.runtime import Runtime
from stevora.settings import Settings
from stevora.tasks import TaskRegistry
from stevora.tools import ToolRegistry
from tests.conftest import create_definition

# gpt-5-mini: OpenAI's cached input is a tenth of its price, as Anthropic's cache reads are.
MODELS = {"openai": "gpt-5-mini", "anthropic": "claude-haiku-4-5"}
SYSTEM = "You are a careful operations agent. " + " ".join(
    f"Rule {n}: check every finding against the runbook before acting." for n in range(60)
)
FAIL_AT = "fail-at"  # the responder fails the request that would open this round once


def _serve(conn: Connection, rounds: int) -> None:
    """The fake provider servers in a process of their own: port out, then serve until closed."""
    from stevora.testing.fake_llm import (
        FakeLLMServer,
        anthropic_text,
        anthropic_tool_use,
        error,
        openai_text,
        openai_tool_calls,
    )
    from stevora.testing.fake_prompt_cache import FakePromptCache

    failed: set[str] = set()
    summaries = {"openai": 0, "anthropic": 0}

    def responder(kind: str) -> Any:
        def respond(body: dict[str, Any]) -> Any:
            text = json.dumps(body.get("messages") or [])
            if not body.get("tools") and "<conversation>" in text:  # a `compact` summary call
                summaries[kind] += 1
                summary = f"Summary {summaries[kind]}: " + "topic checked, logged, nothing open; " * 25
                return openai_text(summary) if kind == "openai" else anthropic_text(summary)
            # The round from the request itself (the highest call answered, plus one): a
            # compacted request carries fewer assistant turns than the rounds done.
            ids = re.findall(r'\\?"(?:tool_call_id|tool_use_id)\\?": ?\\?"(?:call|toolu)_(\d+)', text)
            done = max(map(int, ids)) + 1 if ids else 0
            task = re.search(r"Investigate the incident \((\w+)\)", text)
            marker = kind + (task.group(1) if task else "")  # the run's task names its mode
            if done == rounds // 2 and FAIL_AT in text and marker not in failed:
                failed.add(marker)
                return error(503, "overloaded")
            if kind == "openai":
                if done >= rounds:
                    return openai_text("All findings are in.")
                return openai_tool_calls([(f"call_{done}", "lookup", json.dumps({"topic": f"t{done}"}))])
            if done >= rounds:
                return anthropic_text("All findings are in.")
            return anthropic_tool_use([(f"toolu_{done}", "lookup", {"topic": f"t{done}"})])

        return respond

    with FakeLLMServer() as server:
        server.prompt_cache = FakePromptCache()
        server.openai.responder = responder("openai")
        server.anthropic.responder = responder("anthropic")
        conn.send(server.base_url)
        conn.recv()  # until the bench is done


class Metered:
    """A provider wrapper that splits the worker's CPU into inside and outside the provider call."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.inside: list[float] = []
        self.outside: list[float] = []
        self._left = time.process_time()

    async def complete(self, request: LlmRequest) -> LlmResponse:
        entered = time.process_time()
        self.outside.append(entered - self._left)
        try:
            return await self.inner.complete(request)  # type: ignore[no-any-return]
        finally:
            self._left = time.process_time()
            self.inside.append(self._left - entered)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def _run_mode(url: str, base_url: str, provider: str, mode: str, rounds: int) -> dict[str, Any]:
    settings = Settings(database_url=url, lease_s=600, heartbeat_s=20)
    tools = ToolRegistry()

    async def lookup(input: dict[str, Any]) -> dict[str, Any]:
        topic = input.get("topic", "")
        return {"topic": topic, "summary": f"{topic}: " + "observed, logged and cross-checked; " * 6}

    tools.register(
        "lookup", lookup, parameters={"type": "object", "properties": {"topic": {"type": "string"}}}
    )
    if provider == "openai":
        sdk = OpenAIProvider(
            "test",
            client=openai.AsyncOpenAI(api_key="test", base_url=f"{base_url}/v1", max_retries=0, timeout=60),
        )
    else:
        sdk = AnthropicProvider(
            "test",
            client=anthropic.AsyncAnthropic(api_key="test", base_url=base_url, max_retries=0, timeout=60),
        )
    metered = Metered(sdk)
    dispatcher = InlineDispatcher()
    rt = await Runtime.start(
        settings,
        dispatcher=dispatcher,
        providers=ProviderRouter({provider: metered}),  # type: ignore[dict-item]
        tasks=TaskRegistry(),
        tools=tools,
    )
    try:
        ws = await new_workspace(rt.pool)
        step: dict[str, Any] = {
            "type": "llm",
            "name": "agent",
            "model": MODELS[provider],
            "provider": provider,
            "systemPrompt": SYSTEM,
            "messages": [{"role": "user", "content": "{{input.task}}"}],
            "tools": ["lookup"],
            "maxToolRounds": rounds + 1,
            "retry": {"maxAttempts": 2, "backoffMs": 100},
        }
        if mode == "uncached":
            step["cache"] = False
        if mode == "trimmed":
            # About halfway, the full transcript would be over this.
            step["context"] = {"maxInputTokens": 60 * rounds, "keepLastRounds": 20}
        if mode == "compacted":
            # About a fifth of the way in, the full transcript would be over this.
            step["context"] = {"maxInputTokens": 24 * rounds, "strategy": "compact", "keepLastRounds": 20}
        def_id = await create_definition(
            rt, ws, {"name": f"long-{provider}-{mode}", "version": "1", "steps": [step]}
        )
        pool = RunPool(rt)
        dispatcher.run_pool = pool
        pool.start()
        t0 = time.perf_counter()
        row, _ = await commands.create_run(
            rt, ws, def_id, {"task": f"Investigate the incident ({mode}). {FAIL_AT}"}
        )
        while True:
            await asyncio.sleep(0.2)
            status = await rt.pool.fetchval("SELECT status FROM workflow_runs WHERE id = $1", row["id"])
            if status in ("COMPLETED", "FAILED", "CANCELLED"):
                break
        wall = time.perf_counter() - t0
        await pool.close()
        calls = await rt.pool.fetch(
            "SELECT round, status, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, cost_usd, "
            "pg_column_size(c.*) AS bytes, request->'compaction' AS compaction "
            "FROM llm_calls c WHERE workflow_run_id = $1 ORDER BY created_at",
            row["id"],
        )
        traces = {
            r["round"]: r["bytes"]
            for r in await rt.pool.fetch(
                "SELECT round, sum(pg_column_size(t.*))::int AS bytes FROM tool_trace t "
                "WHERE workflow_run_id = $1 GROUP BY round",
                row["id"],
            )
        }
        error = await rt.pool.fetchval("SELECT error FROM workflow_runs WHERE id = $1", row["id"])
        # What the run would have cost with no token read from a cache (OpenAI caches without
        # being asked, so `cache: false` alone is not an uncached baseline there).
        full_price = sum(
            rt.pricing.cost_usd(provider, MODELS[provider], Usage(c["input_tokens"], c["output_tokens"]))
            or 0.0
            for c in calls
            if c["status"] == "completed"
        )
    finally:
        await rt.close()
    return {
        "status": status,
        "error": error,
        "wall_s": wall,
        "calls": [dict(c) for c in calls],
        "trace_bytes": traces,
        "full_price": full_price,
        "inside_ms": [s * 1000 for s in metered.inside],
        "outside_ms": [s * 1000 for s in metered.outside],
    }


def _report(provider: str, mode: str, result: dict[str, Any], rounds: int) -> None:
    every = [c for c in result["calls"] if c["status"] == "completed"]
    compactions = [c for c in every if c["compaction"] is not None]
    calls = [c for c in every if c["compaction"] is None]  # the loop's rounds
    failed = [i for i, c in enumerate(result["calls"]) if c["status"] != "completed"]
    inputs = [c["input_tokens"] for c in calls]
    reads = [c["cache_read_tokens"] for c in calls]
    cost = sum(c["cost_usd"] for c in every)  # the summary calls' cost included
    from_three = sum(reads[2:]) / max(1, sum(inputs[2:]))
    print(f"\n{provider} / {mode}: {result['status']} in {result['wall_s']:.1f} s, {len(calls)} model calls")
    if result["error"]:
        print(f"  error: {result['error']}")
    for n in sorted({1, 2, 3, min(100, len(calls)), len(calls)}):
        c = calls[n - 1]
        share = c["cache_read_tokens"] / max(1, c["input_tokens"])
        print(
            f"  round {n:>3}: input {c['input_tokens']:>7} tokens, cached {share:6.1%}, "
            f"written {c['cache_write_tokens']:>6}, row {c['bytes']:>6} B + traces "
            f"{result['trace_bytes'].get(c['round'], 0):>5} B"
        )
    for c in compactions:
        marker = json.loads(c["compaction"]) if isinstance(c["compaction"], str) else c["compaction"]
        print(
            f"  compaction at call {c['round']:>3}: {marker['roundsCompacted']:>3} rounds summarised, "
            f"{marker['tokensBefore']:>6} → {marker['tokensAfter']:>5} tokens, ${c['cost_usd']:.5f}"
        )
    if compactions:
        peak = max(inputs)
        print(f"  largest input of any round: {peak} tokens (full transcript at the end: see `cached`)")
    full = result["full_price"]
    print(
        f"  cached share of input tokens from round 3 on: {from_three:.1%}; cost per run ${cost:.4f} "
        f"(${full:.4f} with no cache reads: {cost / full if full else float('nan'):.2f} of it)"
    )
    inside, outside = result["inside_ms"], result["outside_ms"]
    for n in sorted({1, min(100, len(outside)), len(outside)}):
        print(
            f"  worker CPU at call {n:>3}: {outside[n - 1]:6.2f} ms outside the provider call "
            f"(checkpoint, tool, transcript), {inside[n - 1]:6.2f} ms inside (SDK)"
        )
    if failed:
        after = result["calls"][failed[0] + 1]
        share = after["cache_read_tokens"] / max(1, after["input_tokens"])
        print(
            f"  after the crash at round {result['calls'][failed[0]]['round']}: first request cached {share:.1%}"
        )


async def _main(args: argparse.Namespace, url: str) -> None:
    configure_logging(Settings(log_level="ERROR", log_format="json"))
    parent, child = multiprocessing.Pipe()
    server = multiprocessing.get_context("spawn").Process(
        target=_serve, args=(child, args.rounds), daemon=True
    )
    server.start()
    base_url = parent.recv()
    print(f"{args.rounds}-round runs, one lookup call per round, prefix cache modelled by the fake")
    try:
        for provider in args.providers:
            for mode in args.modes:
                result = await _run_mode(url, base_url, provider, mode, args.rounds)
                _report(provider, mode, result, args.rounds)
    finally:
        parent.send("done")
        server.join(timeout=5)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--providers", nargs="+", default=["openai", "anthropic"])
    parser.add_argument("--modes", nargs="+", default=["cached", "uncached", "trimmed", "compacted"])
    args = parser.parse_args()
    asyncio.run(_main(args, bench_database_url("long_horizon")))


if __name__ == "__main__":
    main()
