"""Orchestration overhead of one tool-loop round, against a bare asyncpg transaction.

    .venv/bin/python -m bench.tool_loop [--rounds 20] [--runs-per-level 8]

A zero-latency scripted model asks for one tool per round (`scripted:rounds=N`), the tool
returns at once, so the time between two consecutive model calls of a run is pure Stevora:
commit the llm_calls row + event, run the tool, commit the tool_trace row + event, rebuild and
repair the transcript, build the next request. Runs execute through the real RunPool/driver on
PostgreSQL (no broker hop per round, by design). Printed:

* per-round overhead p50/p99 (ms) at concurrency 1, and by round index (round 1 vs round 20)
* rounds per second at concurrency 1 and 32
* a bare asyncpg transaction inserting a tool_trace row and an event row, measured in the same
  run two ways (BEGIN/INSERT/INSERT/COMMIT, and one CTE statement), and the ratios
Targets (issue #3): overhead <= 3x the bare transaction; round 20 within 20 % of round 1.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import time
from collections import defaultdict
from typing import Any

import asyncpg

from bench.common import bench_database_url, median, new_workspace, pct
from stevora.engine import commands
from stevora.engine.inline import InlineDispatcher
from stevora.engine.run_pool import RunPool
from stevora.ids import new_id
from stevora.llm.messages import LlmRequest, LlmResponse
from stevora.llm.router import ProviderRouter
from stevora.llm.scripted_provider import ScriptedProvider
from stevora.runtime import Runtime
from stevora.settings import Settings
from stevora.tasks import TaskRegistry
from stevora.tools import ToolRegistry
from tests.conftest import create_definition


class TimedProvider(ScriptedProvider):
    """The scripted agent, recording when each run's model calls start."""

    def __init__(self) -> None:
        super().__init__(name="scripted", record_limit=0)
        self.calls: dict[str, list[float]] = defaultdict(list)

    async def complete(self, request: LlmRequest) -> LlmResponse:
        tag = next(m.content for m in request.messages if m.role == "user")
        self.calls[str(tag)].append(time.perf_counter())
        return await super().complete(request)


async def bare_transactions(
    pool: asyncpg.Pool, run_id: str, step_run_id: str, llm_call_id: str, n: int
) -> tuple[float, float]:
    """Mean ms of (a) BEGIN; INSERT trace; INSERT event; COMMIT and (b) the same as one CTE."""
    trace_sql = (
        "INSERT INTO tool_trace (id, workflow_run_id, step_run_id, llm_call_id, round, sequence, tool_call_id, "
        "tool_name, input_json, output_json, status, duration_ms, idempotency_key) "
        "VALUES ($1, $2, $3, $4, 1, $5, 'c', 'noop', $6, $7, 'completed', 0.1, $8)"
    )
    event_sql = (
        "INSERT INTO workflow_events (id, workflow_run_id, step_run_id, sequence, event_type, payload) "
        "VALUES ($1, $2, $3, $4, 'TOOL_CALL_COMPLETED', $5)"
    )
    cte_sql = (
        "WITH t AS (" + trace_sql + " RETURNING id) "
        "INSERT INTO workflow_events (id, workflow_run_id, step_run_id, sequence, event_type, payload) "
        "SELECT $9, $2, $3, $10, 'TOOL_CALL_COMPLETED', $11 FROM t"
    )
    payload = {"toolName": "noop", "durationMs": 0.1}
    seq = 1_000_000 + secrets.randbelow(1_000_000_000)
    timings: list[float] = []
    async with pool.acquire() as conn:
        for _ in range(n):
            seq += 1
            t0 = time.perf_counter()
            async with conn.transaction():
                await conn.execute(
                    trace_sql,
                    new_id("tt"),
                    run_id,
                    step_run_id,
                    llm_call_id,
                    seq,
                    {"a": 1},
                    {"ok": True},
                    f"k{seq}",
                )
                await conn.execute(event_sql, new_id("evt"), run_id, step_run_id, seq, payload)
            timings.append(time.perf_counter() - t0)
        tx_ms = sum(timings[n // 10 :]) / len(timings[n // 10 :]) * 1000
        timings.clear()
        for _ in range(n):
            seq += 1
            t0 = time.perf_counter()
            await conn.execute(
                cte_sql,
                new_id("tt"),
                run_id,
                step_run_id,
                llm_call_id,
                seq,
                {"a": 1},
                {"ok": True},
                f"k{seq}",
                new_id("evt"),
                seq,
                payload,
            )
            timings.append(time.perf_counter() - t0)
        cte_ms = sum(timings[n // 10 :]) / len(timings[n // 10 :]) * 1000
    return tx_ms, cte_ms


async def run_level(
    rt: Runtime, provider: TimedProvider, ws: str, def_id: str, concurrency: int, rounds: int
) -> dict[str, Any]:
    provider.calls.clear()
    t0 = time.perf_counter()
    runs = [
        (await commands.create_run(rt, ws, def_id, {"tag": f"{concurrency}-{i}-{new_id('x')}"}))[0]["id"]
        for i in range(concurrency)
    ]
    pending = set(runs)
    while pending:
        rows = await rt.pool.fetch(
            "SELECT id, status, error FROM workflow_runs WHERE id = ANY($1::text[])", list(pending)
        )
        for row in rows:
            if row["status"] in ("COMPLETED", "FAILED"):
                if row["status"] == "FAILED":
                    raise SystemExit(f"run failed: {row['error']}")
                pending.discard(row["id"])
        await asyncio.sleep(0.005)
    wall = time.perf_counter() - t0
    per_round: list[float] = []
    by_index: dict[int, list[float]] = defaultdict(list)
    for stamps in provider.calls.values():
        for k in range(1, len(stamps)):
            per_round.append((stamps[k] - stamps[k - 1]) * 1000)
            by_index[k].append((stamps[k] - stamps[k - 1]) * 1000)
    total_rounds = sum(len(s) - 1 for s in provider.calls.values())
    return {"wall": wall, "per_round": per_round, "by_index": by_index, "rounds_per_s": total_rounds / wall}


async def main(url: str, rounds: int, repeats: int) -> None:
    settings = Settings(database_url=url, hot_pool_size=20, lease_s=30, heartbeat_s=10)
    provider = TimedProvider()
    tools = ToolRegistry()

    async def noop(input: dict[str, Any]) -> dict[str, bool]:
        return {"ok": True}

    tools.register(
        "noop",
        noop,
        description="does nothing",
        parameters={"type": "object", "properties": {"note": {"type": "string"}}},
    )
    dispatcher = InlineDispatcher()
    rt = await Runtime.start(
        settings,
        dispatcher=dispatcher,
        providers=ProviderRouter({"scripted": provider}),
        tasks=TaskRegistry(),
        tools=tools,
    )
    pool = RunPool(rt)
    dispatcher.run_pool = pool
    pool.start()
    ws = await new_workspace(rt.pool)
    def_id = await create_definition(
        rt,
        ws,
        {
            "name": "bench-loop",
            "version": new_id("v"),
            "steps": [
                {
                    "type": "llm",
                    "name": "agent",
                    "model": f"scripted:rounds={rounds}",
                    "maxToolRounds": rounds,
                    "messages": [{"role": "user", "content": "{{input.tag}}"}],
                    "tools": ["noop"],
                }
            ],
        },
    )
    try:
        await run_level(rt, provider, ws, def_id, 2, rounds)  # warm up caches, statements, pools
        serial = [await run_level(rt, provider, ws, def_id, 1, rounds) for _ in range(repeats)]
        per_round = [x for r in serial for x in r["per_round"]]
        first = [x for r in serial for x in r["by_index"][1]]
        last = [x for r in serial for x in r["by_index"][rounds]]
        parallel = await run_level(rt, provider, ws, def_id, 32, rounds)
        anchor = await rt.pool.fetchrow(
            "SELECT t.workflow_run_id, t.step_run_id, t.llm_call_id FROM tool_trace t LIMIT 1"
        )
        tx_ms, cte_ms = await bare_transactions(
            rt.pool, anchor["workflow_run_id"], anchor["step_run_id"], anchor["llm_call_id"], 1000
        )
    finally:
        await pool.close()
        await rt.close()
    p50 = median(per_round)
    print(f"tool loop, {rounds} rounds per run, one tool call per round, zero-latency model, PostgreSQL")
    print(
        f"  per-round overhead  p50 {p50:.3f} ms   p99 {pct(per_round, 99):.3f} ms   (concurrency 1, {len(per_round)} rounds)"
    )
    print(
        f"  round 1 p50 {median(first):.3f} ms   round {rounds} p50 {median(last):.3f} ms   "
        f"change {100 * (median(last) / median(first) - 1):+.1f} %   (target within ±20 %)"
    )
    print(
        f"  rounds/s  concurrency 1: {sum(r['rounds_per_s'] for r in serial) / len(serial):.0f}   "
        f"concurrency 32: {parallel['rounds_per_s']:.0f}"
    )
    print(
        f"  bare asyncpg tx (BEGIN; INSERT trace; INSERT event; COMMIT): {tx_ms:.3f} ms   one-statement CTE: {cte_ms:.3f} ms"
    )
    print(f"  ratio per-round p50 / bare tx: {p50 / tx_ms:.2f}x (target <= 3x)   / CTE: {p50 / cte_ms:.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    asyncio.run(main(bench_database_url("tool_loop"), args.rounds, args.repeats))
