"""SQL time per statement of the tool loop, from pg_stat_statements.

    STEVORA_BENCH_SERVER_URL=postgresql+asyncpg://postgres@127.0.0.1:5439/postgres \\
        .venv/bin/python -m bench.statements [--rounds 20 5] [--concurrency 32] [--waves 3]

Needs a PostgreSQL started with `shared_preload_libraries = pg_stat_statements` — use a private
instance, never restart a shared one (docs/benchmarks.md shows how). For each round count it
resets the statistics, executes the runs at `--concurrency`, and prints every statement's calls
per run and per round, mean execution time and share of the total (planning time excluded:
asyncpg prepares each statement once per connection).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re

from bench.common import bench_database_url
from bench.harness import LoopBench


def _label(query: str) -> str:
    q = re.sub(r"\s+", " ", query).strip()
    return q[:100] + ("…" if len(q) > 100 else "")


async def main(url: str, rounds_list: list[int], concurrency: int, waves: int) -> None:
    bench = await LoopBench.start(url, hot_pool_size=20)
    try:
        await bench.rt.pool.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        await bench.level(5, 8, 16)  # warm up
        for rounds in rounds_list:
            runs = concurrency * waves
            ids = await bench.create_runs(rounds, runs)
            await bench.rt.pool.execute("SELECT pg_stat_statements_reset()")
            wall, _, _ = await bench.execute(ids, concurrency)
            rows = await bench.rt.pool.fetch(
                "SELECT query, calls, total_exec_time, mean_exec_time FROM pg_stat_statements "
                "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
                "AND query NOT ILIKE '%pg_stat_statements%' ORDER BY total_exec_time DESC"
            )
            total = sum(r["total_exec_time"] for r in rows)
            calls = sum(r["calls"] for r in rows)
            print(
                f"\n{rounds}-round runs, concurrency {concurrency}, {runs} runs: {calls / runs:.1f} statements per run, "
                f"SQL execution {total / runs:.2f} ms per run ({total / (runs * rounds):.3f} ms per round), "
                f"wall {wall:.2f} s, load {os.getloadavg()[0]:.1f}"
            )
            print(f"  {'calls/run':>9} {'mean ms':>8} {'share':>6}  statement")
            for r in rows[:18]:
                print(
                    f"  {r['calls'] / runs:>9.2f} {r['mean_exec_time']:>8.3f} {100 * r['total_exec_time'] / total:>5.1f}%  "
                    f"{_label(r['query'])}"
                )
    finally:
        await bench.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, nargs="+", default=[20, 5])
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--waves", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(bench_database_url("statements"), args.rounds, args.concurrency, args.waves))
