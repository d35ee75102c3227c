"""Fork creation latency, the storage a fork costs per inherited round, and bulk replay.

    .venv/bin/python -m bench.fork [--rounds 5 20 100] [--forks 30] [--replays 100]

For each round count one origin run of the scripted agent (one `noop` tool per round) is executed,
then forked `--forks` times at its middle round (`plan_fork` + `create_fork`: the whole HTTP path
minus the HTTP layer), the forks not executed. Printed per round count: fork creation p50/p99 in
ms, and the bytes a fork adds per inherited round (the growth of `llm_calls`, `tool_trace`,
`step_runs` and `workflow_runs` heap + indexes, divided by the rounds it inherits), beside the
bytes the origin's own rounds took. An `llm` step allows at most 20 tool rounds
(`maxToolRounds`); the bench lifts that cap in the worker's cached definition for the 100-round
run (bench/harness.py), as for the loop benchmarks.

Bulk replay: `--replays` origin runs of 5 rounds are executed, then each is replayed with recorded
tools against another model name (`plan_replay` + `fork.make`, what `POST /v1/replays` does
per run, a derived definition version stored once), the replays executed by a run pool of 10, and
compared (`engine.bulk.compare`). Printed: replays created per second, replays run to the end per
second (creation + execution), the comparison's time, and the matched / unmatched tool calls.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import asyncpg

from bench.common import bench_database_url, median, pct
from bench.harness import LoopBench
from stevora.engine import bulk
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


async def _bulk_replay(bench: LoopBench, runs: int, rounds: int = 5) -> None:
    origins = await bench.create_runs(rounds, runs)
    await bench.execute(origins, 10)
    bench.provider.calls.clear()  # the replays' model calls count from their first round again
    t0 = time.perf_counter()
    replay_ids = []
    for origin in origins:
        plan = await forking.plan_replay(bench.rt, bench.ws, origin, model=f"scripted:rounds={rounds}:replay")
        run, _ = await forking.make(bench.rt, plan, None)
        replay_ids.append(run["id"])
    created = time.perf_counter() - t0
    wall, _, _ = await bench.execute(replay_ids, 10)
    t1 = time.perf_counter()
    comparison = await bulk.compare(bench.rt, bench.ws, replay_ids)
    compared = time.perf_counter() - t1
    matched = sum(r["replay"]["toolCalls"]["matched"] for r in comparison["runs"])
    unmatched = sum(r["replay"]["toolCalls"]["unmatched"] for r in comparison["runs"])
    same_rounds = sum(1 for r in comparison["runs"] if r["origin"]["rounds"] == r["replay"]["rounds"])
    print(
        f"bulk replay of {runs} runs x {rounds} rounds: created {runs / created:6.1f} replays/s, "
        f"run to the end {runs / (created + wall):6.1f} runs/s ({wall:.2f} s executing, 10 at once), "
        f"compared in {compared * 1000:.0f} ms  |  tool calls matched {matched}, unmatched {unmatched}; "
        f"{same_rounds}/{runs} replays with the origin's rounds"
    )


async def main(url: str, rounds: list[int], forks: int, replays: int) -> None:
    bench = await LoopBench.start(url)
    try:
        for n in rounds:
            await _measure(bench, n, forks)
        if replays:
            await _bulk_replay(bench, replays)
    finally:
        await bench.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, nargs="+", default=[5, 20, 100])
    parser.add_argument("--forks", type=int, default=30)
    parser.add_argument("--replays", type=int, default=100, help="runs replayed in bulk (0: none)")
    args = parser.parse_args()
    asyncio.run(main(bench_database_url("fork"), args.rounds, args.forks, args.replays))
