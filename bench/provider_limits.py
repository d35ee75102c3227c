"""Provider rate limits shared by every worker (docs/flow-control.md, "Provider rate limits").

    .venv/bin/python -m bench.provider_limits [--runs 2000] [--processes 4] [--rpm 600] [--tpm 100000]
                                             [--window-s 60] [--modes limited unlimited]

A fake OpenAI (stevora/testing/fake_llm.py in its enforcing mode) allows `--rpm` requests and
`--tpm` tokens per `--window-s` and answers 429 with retry-after beyond. The default is the issue's
600 and 100,000 per minute, unscaled: four worker processes on a loaded 2-core machine cannot offer
the 60 calls a second a 10 s window asks, so the limiter would have nothing to hold back.
`--runs` runs of a one-call `llm` step (a ~400-character prompt, maxTokens 100: ~200 tokens
estimated, ~130 used) are created first, then `--processes` real worker processes
(`python -m workers`, RabbitMQ) execute them: once with `STEVORA_RATE_LIMITS` set to the
provider's limits, once without. Printed per mode: the model calls the fake received, how many got
a 429 (and their share), calls served per second against the provider's limit and as a share of
its allowance over the time served (a full bucket, then the window's rate), the wall time until
every run completed, the waits for a turn, when each tenth of the calls was served, and the
attempts the limiter did not send (turn beyond the longest wait). Then the limiter's own cost:
transactions per call (pg_stat_database) and the median reservation time beside a `SELECT 1`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import secrets
import time
from typing import Any

from bench.common import bench_database_url, median, new_workspace, pct
from stevora.db.database import create_pool
from stevora.engine import commands
from stevora.engine.brokers import build_broker
from stevora.engine.dispatch import DramatiqDispatcher
from stevora.engine.provider_limits import ProviderLimits
from stevora.logging import configure_logging
from stevora.runtime import Runtime
from stevora.settings import ProviderRateLimit, Settings
from stevora.testing.fake_llm import FakeLLMServer, FakeResponse, openai_text
from stevora.testing.fake_rate_limit import FakeRateLimit, request_tokens
from tests.conftest import create_definition
from tests.e2e.workerproc import WorkerProcess

BROKER = "amqp://guest:guest@127.0.0.1:5672/"
MODEL = "gpt-4o-mini"
PROMPT = "Summarise the customer's ticket in one line. " * 9  # ~400 characters
MAX_TOKENS = 100
ANSWER_TOKENS = 30


def _respond(body: dict[str, Any]) -> FakeResponse:
    prompt = request_tokens("openai", body) - MAX_TOKENS
    usage = {"prompt_tokens": prompt, "completion_tokens": ANSWER_TOKENS}
    return openai_text("One line.", model=MODEL, usage=usage)


async def _mode(url: str, args: argparse.Namespace, limited: bool) -> dict[str, float]:
    queue = f"bench-limits-{secrets.token_hex(3)}"
    settings = Settings(database_url=url, broker_url=BROKER, queue_name=queue)
    broker = build_broker(BROKER)
    rt = await Runtime.start(settings, dispatcher=DramatiqDispatcher(broker, queue))
    server = FakeLLMServer(responder=_respond)
    server.rate_limit = fake = FakeRateLimit(requests=args.rpm, tokens=args.tpm, window_s=args.window_s)
    workers: list[WorkerProcess] = []
    try:
        ws = await new_workspace(rt.pool)
        def_id = await create_definition(
            rt,
            ws,
            {
                "name": "limited" if limited else "unlimited",
                "version": "1",
                "steps": [
                    {
                        "type": "llm",
                        "name": "ask",
                        "model": MODEL,
                        "maxTokens": MAX_TOKENS,
                        "messages": [{"role": "user", "content": PROMPT + "{{input.n}}"}],
                        "retry": {
                            "maxAttempts": 20,
                            "backoffMs": 1000,
                            "backoffMultiplier": 1.5,
                            "maxBackoffMs": 10000,
                        },
                    }
                ],
            },
        )
        ids = [(await commands.create_run(rt, ws, def_id, {"n": str(i)}))[0]["id"] for i in range(args.runs)]
        env = {
            "OPENAI_API_KEY": "test",
            "OPENAI_BASE_URL": server.openai_base_url,
            "STEVORA_LLM_STREAM": "false",
            "STEVORA_RATE_LIMIT_WINDOW_S": str(args.window_s),
            "STEVORA_LEASE_S": "30",
            "STEVORA_HEARTBEAT_S": "5",
            "STEVORA_SWEEP_INTERVAL_S": "2",
            "STEVORA_UNDISPATCHED_GRACE_S": "30",
        }
        if limited:
            env["STEVORA_RATE_LIMITS"] = json.dumps({f"openai:{MODEL}": {"rpm": args.rpm, "tpm": args.tpm}})
        started = time.monotonic()
        workers = [WorkerProcess(url, BROKER, queue, extra_env=env) for _ in range(args.processes)]
        left = len(ids)
        while left and time.monotonic() - started < args.timeout_s:
            await asyncio.sleep(0.5)
            left = await rt.pool.fetchval(
                "SELECT count(*) FROM workflow_runs WHERE id = ANY($1::text[]) AND status <> 'COMPLETED'", ids
            )
        wall = time.monotonic() - started
        not_sent = await rt.pool.fetchval(
            "SELECT count(*) FROM workflow_events WHERE workflow_run_id = ANY($1::text[]) "
            "AND event_type = 'LLM_CALL_FAILED' AND payload->'error'->>'code' = 'RATE_LIMITED'",
            ids,
        )
        waits = [
            float(r["w"])
            for r in await rt.pool.fetch(
                "SELECT (payload->>'rateLimitWaitMs')::float8 AS w FROM workflow_events "
                "WHERE workflow_run_id = ANY($1::text[]) AND event_type = 'LLM_CALL_COMPLETED' "
                "AND payload ? 'rateLimitWaitMs'",
                ids,
            )
        ]
    finally:
        for w in workers:
            w.stop()
        server.close()
        await rt.close()
        broker.close()
    log = list(fake.log)
    served = [d for d in log if d.status == 200]
    span = (served[-1].at - served[0].at) if len(served) > 1 else float("nan")
    # What the provider allows over that span: a full bucket, then the window's rate.
    allowance = args.rpm + args.rpm * span / args.window_s
    # Seconds from the first served call until each tenth of them was served (a tail of runs
    # resumed late, e.g. after a lease expired, shows at the end).
    tenths = (
        [served[min(len(served) - 1, len(served) * k // 10)].at - served[0].at for k in range(1, 11)]
        if served
        else []
    )
    return {
        "tenths": tenths,
        "not_sent": not_sent,
        "calls": len(log),
        "refused": len(log) - len(served),
        "served": len(served),
        "span_s": span,
        "served_per_s": len(served) / span,
        "limit_per_s": args.rpm / args.window_s,
        "share_of_allowance": len(served) / allowance,
        "left": left,
        "wall_s": wall,
        "wait_p50_ms": pct(waits, 50),
        "wait_p99_ms": pct(waits, 99),
    }


async def _cost(url: str, n: int) -> dict[str, float]:
    """The limiter's own cost per call, against a limit that never makes anyone wait; beside it a
    `SELECT 1` round trip on the same connection (what the machine's load makes of any statement)."""
    pool = await create_pool(url, max_size=1)  # one backend: its transactions are the limiter's
    other = await create_pool(url, max_size=1)
    try:
        limits = ProviderLimits(pool, {"bench:cost": ProviderRateLimit(rpm=10**9, tpm=10**12)})
        budget = limits.budgets["bench:cost"]
        await limits.reserve(budget, 200, 60)  # creates the bucket

        async def commits() -> int:
            await pool.fetchval("SELECT pg_stat_force_next_flush()")
            await asyncio.sleep(0.3)
            return int(
                await other.fetchval(
                    "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
                )
            )

        before = await commits()
        for _ in range(n):
            await limits.reserve(budget, 200, 60)
        per_call = (await commits() - before - 1) / n  # less the flush request itself
        # Interleaved, medians: the shared machine's load moves both alike.
        reserve_s, select_s = [], []
        for _ in range(n):
            t0 = time.perf_counter()
            await limits.reserve(budget, 200, 60)
            t1 = time.perf_counter()
            await pool.fetchval("SELECT 1")
            reserve_s.append(t1 - t0)
            select_s.append(time.perf_counter() - t1)
        return {
            "us_reserve": median(reserve_s) * 1e6,
            "us_select_1": median(select_s) * 1e6,
            "transactions_per_call": per_call,
        }
    finally:
        await pool.close()
        await other.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--rpm", type=int, default=600, help="requests per window")
    parser.add_argument("--tpm", type=int, default=100_000, help="tokens per window")
    parser.add_argument("--window-s", type=float, default=60.0, help="the window of --rpm / --tpm")
    parser.add_argument(
        "--modes", nargs="+", default=["limited", "unlimited"], choices=["limited", "unlimited"]
    )
    parser.add_argument("--timeout-s", type=float, default=240.0, help="per mode")
    parser.add_argument("--cost-calls", type=int, default=2000)
    args = parser.parse_args()
    configure_logging(Settings(log_level="WARNING", log_format="console"))
    # pika reports its idle publishing connection reset by RabbitMQ while a mode runs; harmless.
    logging.getLogger("pika").setLevel(logging.CRITICAL)
    url = bench_database_url("provider_limits")
    print(
        f"provider rate limits: {args.runs} one-call runs over {args.processes} worker processes (RabbitMQ); "
        f"fake provider enforcing {args.rpm} requests and {args.tpm} tokens per {args.window_s:g} s; "
        f"{os.cpu_count()} CPUs"
    )
    print(
        f"{'mode':<10}{'calls':>7}{'429s':>7}{'429 %':>7}{'served/s':>10}{'limit/s':>9}{'of allowance':>14}"
        f"{'runs left':>10}{'wall s':>8}{'wait p50/p99 ms':>18}"
    )
    for mode in args.modes:
        r = asyncio.run(_mode(url, args, mode == "limited"))
        waits = f"{r['wait_p50_ms']:.0f}/{r['wait_p99_ms']:.0f}"
        print(
            f"{mode:<10}{r['calls']:>7}{r['refused']:>7}{100 * r['refused'] / max(1, r['calls']):>7.2f}"
            f"{r['served_per_s']:>10.1f}{r['limit_per_s']:>9.1f}{100 * r['share_of_allowance']:>13.1f}%"
            f"{r['left']:>10}{r['wall_s']:>8.1f}{waits:>18}"
        )
        print(
            f"{'':<10}served calls by tenths, s after the first: {' '.join(f'{t:.0f}' for t in r['tenths'])}; "
            f"attempts not sent (turn beyond STEVORA_RATE_LIMIT_MAX_WAIT_S, retried at their turn): {r['not_sent']}"
        )
    cost = asyncio.run(_cost(url, args.cost_calls))
    print(
        f"limiter cost per model call: {cost['transactions_per_call']:.2f} transactions of one statement "
        f"(the usage correction rides on the next reservation), {cost['us_reserve']:.0f} µs per reservation (median) "
        f"(a SELECT 1 round trip on the same connection: {cost['us_select_1']:.0f} µs); "
        f"without STEVORA_RATE_LIMITS: no statement"
    )


if __name__ == "__main__":
    main()
