"""Fork creation latency and the storage a fork costs per inherited round.

    .venv/bin/python -m bench.fork [--rounds 5 20] [--forks 50]

For each round count one origin run of the scripted agent (one `noop` tool per round) is executed,
then forked `--forks` times at its middle round (`plan_fork` + `create_fork`: the whole HTTP path
minus the HTTP layer), the forks not executed. Printed per round count: fork creation p50/p99 in
ms, and the bytes a fork adds per inherited round (the growth of `llm_calls`, `tool_trace`,
`step_runs` and `workflow_runs` heap + indexes, divided by the rounds it inherits), beside the
bytes the origin's own rounds took. An `llm` step allows at most 20 tool rounds
(`maxToolRounds`), so 100-round runs are not measured.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import asyncpg

from bench.common import bench_database_url, median, pct
from bench.harness import LoopBench
from stevora.engine import fork as forking

_TABLES = ("llm_calls", "tool_trace", "step_runs", "workflow_runs")


async def _bytes(pool: asyncpg.Pool) -> int:
    total = 0
    for table in _TABLES:
        total += await pool.fetchval("SELECT pg_total_relation_size($1::regclass)", table)
    return int(total)


async def _measure(bench: LoopBench, rounds: int, forks: int) -> None:
    empty = await _bytes(bench.rt.pool)
    (origin,) = await bench.create_runs(rounds, 1)
    await bench.execute([origin], 1)
    after_origin = await _bytes(bench.rt.pool)
    fork_round = max(2, rounds // 2)
    at = {"step": "agent", "round": fork_round}
    inherited = fork_round - 1
    timings: list[float] = []
    for _ in range(forks):
        t0 = time.perf_counter()
        plan = await forking.plan_fork(bench.rt, bench.ws, origin, at, None)
        run = await bench.rt.pool.fetchval("SELECT definition_id FROM workflow_runs WHERE id = $1", origin)
        await forking.create_fork(bench.rt, plan, run, None)
        timings.append((time.perf_counter() - t0) * 1000)
    after_forks = await _bytes(bench.rt.pool)
    per_fork = (after_forks - after_origin) / forks
    print(
        f"rounds={rounds:>3}  fork at round {fork_round:>2}: create p50 {median(timings):6.2f} ms  "
        f"p99 {pct(timings, 99):6.2f} ms  |  per fork {per_fork / 1024:6.1f} KiB = "
        f"{per_fork / max(1, inherited) / 1024:5.2f} KiB per inherited round  "
        f"(origin: {(after_origin - empty) / rounds / 1024:5.2f} KiB per round, page-granular)"
    )


async def main(url: str, rounds: list[int], forks: int) -> None:
    bench = await LoopBench.start(url)
    try:
        for n in rounds:
            await _measure(bench, n, forks)
    finally:
        await bench.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, nargs="+", default=[5, 20])
    parser.add_argument("--forks", type=int, default=50)
    args = parser.parse_args()
    asyncio.run(main(bench_database_url("fork"), args.rounds, args.forks))
