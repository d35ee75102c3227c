"""Micro-benchmarks of the throughput levers of issue 12, each in isolation.

    .venv/bin/python -m bench.levers [--n 20000]

* JSON codec for the jsonb columns: the stdlib codec (before) vs orjson (stevora/db/database.py
  now), in process and through asyncpg round trips.
* Event loop: asyncio vs uvloop, 32 concurrent clients doing the checkpoint CTE.
* Prepared statements: asyncpg's statement cache on (the pool's setting) vs off.
* Transcript: `prepare_transcript` on a 20-round history (it runs before every model call) and
  the one-off `rebuild` from committed rows.

Group commit has its own: `python -m bench.group_commit`.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from stevora.db import database

# -- codec selection (used by bench.tool_loop --codec) ---------------------------------------------


def _stdlib_dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)


async def _stdlib_init(conn: asyncpg.Connection) -> None:
    """The codec before issue 12: stdlib json, jsonb as text."""
    await conn.set_type_codec("jsonb", encoder=_stdlib_dumps, decoder=json.loads, schema="pg_catalog")
    await conn.set_type_codec("json", encoder=_stdlib_dumps, decoder=json.loads, schema="pg_catalog")


CODECS: dict[str, Callable[[asyncpg.Connection], Awaitable[None]]] = {
    "stdlib": _stdlib_init,
    "orjson": database._init_connection,
}


def use_codec(name: str) -> str:
    """Make new asyncpg pools use codec `name` ("default": whatever stevora.db.database has)."""
    if name != "default":
        database._init_connection = CODECS[name]  # type: ignore[assignment]
        return name
    return "orjson"


# -- payloads shaped like a checkpoint's ---------------------------------------------------------

REQUEST = {
    "messages": [{"role": "tool", "content": '{"ok":true}', "toolCallId": "call_r3_0", "name": "noop"}],
    "model": "gpt-4o-mini",
    "tools": ["noop", "search", "fetch"],
    "temperature": 0.2,
    "maxTokens": 1024,
    "responseFormat": None,
}
RESPONSE = {
    "text": "Let me look that up for you before answering the question about the order status.",
    "toolCalls": [
        {"id": "call_r4_0", "name": "search", "arguments": {"query": "order 1234 status", "limit": 5}}
    ],
    "finishReason": "tool_calls",
    "usage": {"inputTokens": 812, "outputTokens": 41},
}
PAYLOAD = {"round": 4, "model": "gpt-4o-mini", "provider": "openai", "durationMs": 412.3, "costUsd": 0.00045}


def per_call_us(fn: Callable[[], Any], n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def codec_in_process(n: int) -> None:
    import orjson

    docs = [REQUEST, RESPONSE, PAYLOAD]
    text = [_stdlib_dumps(d) for d in docs]
    print("JSON codec, one checkpoint's three jsonb values (request, response, event payload), µs:")
    print(f"  encode stdlib json.dumps      {per_call_us(lambda: [_stdlib_dumps(d) for d in docs], n):7.2f}")
    print(
        f"  encode orjson → str           {per_call_us(lambda: [database._dumps(d) for d in docs], n):7.2f}"
    )
    print(f"  decode stdlib json.loads      {per_call_us(lambda: [json.loads(t) for t in text], n):7.2f}")
    print(f"  decode orjson.loads(str)      {per_call_us(lambda: [orjson.loads(t) for t in text], n):7.2f}")


_KEYS = itertools.count()


async def _cte_clients(pool: asyncpg.Pool, clients: int, per_client: int) -> float:
    """Checkpoints per second: `clients` tasks each running the trace+event CTE on a temp table."""

    async def client() -> None:
        for _ in range(per_client):
            await pool.execute(
                "WITH t AS (INSERT INTO bench_trace (k, doc) VALUES ($1, $2) RETURNING k) "
                "INSERT INTO bench_event (k, doc) SELECT k, $3 FROM t",
                next(_KEYS),
                RESPONSE,
                PAYLOAD,
            )

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return clients * per_client / (time.perf_counter() - t0)


async def _setup_tables(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            "DROP TABLE IF EXISTS bench_trace, bench_event; "
            "CREATE TABLE bench_trace (k bigint PRIMARY KEY, doc jsonb); "
            "CREATE TABLE bench_event (k bigint, doc jsonb)"
        )
    finally:
        await conn.close()


async def round_trips(dsn: str, codec: str, cache: int, clients: int, per_client: int) -> tuple[float, float]:
    """(checkpoints/s, process CPU ms per checkpoint) for one codec / statement-cache setting."""
    await _setup_tables(dsn)
    pool = await asyncpg.create_pool(
        dsn, min_size=min(clients, 20), max_size=20, init=CODECS[codec], statement_cache_size=cache
    )
    assert pool is not None
    try:
        await _cte_clients(pool, clients, 20)  # warm up
        cpu0 = time.process_time()
        rate = await _cte_clients(pool, clients, per_client)
        cpu_ms = (time.process_time() - cpu0) / (clients * per_client) * 1000
    finally:
        await pool.close()
    return rate, cpu_ms


def transcript_costs(n: int) -> None:
    from stevora.llm.messages import Message, ToolCall
    from stevora.llm.transcript import prepare_transcript

    history: list[Message] = [Message.system("You are a bench."), Message(role="user", content="go")]
    for r in range(20):
        call = ToolCall(f"call_r{r}_0", "noop", {"note": "x"})
        history.append(Message(role="assistant", content=None, tool_calls=(call,)))
        history.append(Message.tool_result(call.id, '{"ok":true}', name="noop"))
    per = per_call_us(lambda: prepare_transcript(history, provider_name="openai"), n // 10)
    print(f"prepare_transcript on a 20-round history (runs before every model call): {per:.1f} µs")
    per5 = per_call_us(lambda: prepare_transcript(history[:12], provider_name="openai"), n // 10)
    print(f"  on a 5-round history: {per5:.1f} µs  (grows linearly; summed over a 20-round run: O(n²))")


async def main(dsn: str, n: int) -> None:
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    codec_in_process(n)
    transcript_costs(n)
    print("trace+event CTE through asyncpg, 32 concurrent clients (checkpoints/s, worker CPU ms each):")
    for codec in ("stdlib", "orjson"):
        for cache in (256, 0):
            rates = [await round_trips(dsn, codec, cache, 32, 100) for _ in range(3)]
            lo, hi = min(r for r, _ in rates), max(r for r, _ in rates)
            cpu = sorted(c for _, c in rates)[1]
            print(
                f"  codec {codec:<12} statement cache {cache:>3}: {lo:6.0f}-{hi:6.0f}/s   "
                f"{cpu:.3f} ms CPU   (load {os.getloadavg()[0]:.1f})"
            )


def run_loop_comparison(dsn: str, n_clients: int) -> None:
    """asyncio vs uvloop on the same CTE workload, each in a fresh event loop."""
    import uvloop

    for name, runner in (("asyncio", asyncio.run), ("uvloop", uvloop.run)):
        rates = [runner(round_trips(dsn, "orjson", 256, n_clients, 100)) for _ in range(3)]
        lo, hi = min(r for r, _ in rates), max(r for r, _ in rates)
        cpu = sorted(c for _, c in rates)[1]
        print(
            f"  event loop {name:<8} {n_clients} clients: {lo:6.0f}-{hi:6.0f} checkpoints/s   "
            f"{cpu:.3f} ms CPU each   (load {os.getloadavg()[0]:.1f})"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=20000)
    args = parser.parse_args()
    from bench.common import bench_database_url

    dsn = database.asyncpg_dsn(bench_database_url("levers"))
    asyncio.run(main(dsn, args.n))
    print("event loop, trace+event CTE (orjson codec, statement cache on):")
    for clients in (32, 128):
        run_loop_comparison(dsn, clients)
