"""Scale-out: 1, 2 and 4 worker processes against one PostgreSQL.

    .venv/bin/python -m bench.scale_out [--processes 1 2 4] [--concurrency 32] [--rounds 20]
                                        [--waves 3] [--repeats 2] [--uvloop] [--group-commit on|off]

Each process is a full worker runtime (its own asyncpg pool, RunPool and driver) executing its
own runs of the tool-loop benchmark (bench/harness.py) at `--concurrency` runs in flight. All
processes create their runs first, then start together (a barrier); the figure is every
process's rounds over the time from the common start to the last process going idle. Printed
beside it: worker CPU (all processes) and the CPU of the PostgreSQL backends serving them (from
/proc/<pid>/stat), both as cores busy and per round, and the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import time
from multiprocessing.synchronize import Barrier
from typing import Any

import asyncpg

from bench.common import bench_database_url, median
from bench.harness import LoopBench, backend_cpu_s
from stevora.db.database import asyncpg_dsn


def _worker(
    url: str,
    rounds: int,
    concurrency: int,
    runs: int,
    uvloop: bool,
    group_commit: bool,
    barrier: Barrier,
    done: Barrier,
    out: Any,
) -> None:
    async def main() -> None:
        bench = await LoopBench.start(
            url, hot_pool_size=max(10, min(concurrency, 20)), group_commit=group_commit
        )
        try:
            await bench.level(rounds, 8, 8)  # warm up
            ids = await bench.create_runs(rounds, runs)
            await asyncio.to_thread(barrier.wait)
            start = time.time()
            _, cpu, _ = await bench.execute(ids, concurrency)
            out.put((start, time.time(), runs * rounds, cpu))
            # Keep the connections (their backends' CPU counters) until the parent has read them.
            await asyncio.to_thread(done.wait)
        finally:
            await bench.close()

    if uvloop:
        import uvloop as _uvloop

        _uvloop.run(main())
    else:
        asyncio.run(main())


async def _backend_pids(url: str) -> list[int]:
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        rows = await conn.fetch(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return [r["pid"] for r in rows]
    finally:
        await conn.close()


def one(url: str, n: int, args: argparse.Namespace) -> dict[str, float]:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(n + 1)
    done = ctx.Barrier(n + 1)
    out = ctx.Queue()
    runs = args.concurrency * args.waves
    procs = [
        ctx.Process(
            target=_worker,
            args=(
                url,
                args.rounds,
                args.concurrency,
                runs,
                args.uvloop,
                args.group_commit,
                barrier,
                done,
                out,
            ),
        )
        for _ in range(n)
    ]
    for p in procs:
        p.start()
    barrier.wait(timeout=300)
    # The pools are open by now (warm-up done); connections opened later count from zero.
    pids = asyncio.run(_backend_pids(url))
    db0 = backend_cpu_s(pids)
    results = [out.get(timeout=600) for _ in range(n)]
    pids = sorted(set(pids) | set(asyncio.run(_backend_pids(url))))
    db_s = backend_cpu_s(pids) - db0
    done.wait(timeout=60)
    for p in procs:
        p.join(timeout=60)
    start = min(r[0] for r in results)
    wall = max(r[1] for r in results) - start
    rounds = sum(r[2] for r in results)
    worker_cpu = sum(r[3] for r in results)
    return {
        "rounds_per_s": rounds / wall,
        "worker_cores": worker_cpu / wall,
        "db_cores": db_s / wall,
        "worker_ms_per_round": worker_cpu / rounds * 1000,
        "db_ms_per_round": db_s / rounds * 1000,
        "load": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--concurrency", type=int, default=32, help="runs in flight per process")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--waves", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--uvloop", action="store_true")
    parser.add_argument(
        "--group-commit", choices=["on", "off"], default="on", help="STEVORA_GROUP_COMMIT (default on)"
    )
    args = parser.parse_args()
    args.group_commit = args.group_commit == "on"
    url = bench_database_url("scale_out")
    print(
        f"scale-out: {args.rounds}-round runs, {args.concurrency} in flight per process, one PostgreSQL, "
        f"{os.cpu_count()} CPUs, event loop {'uvloop' if args.uvloop else 'asyncio'}, "
        f"group commit {'on' if args.group_commit else 'off'}"
    )
    print(
        f"{'processes':>9}  {'rounds/s median [min-max]':<27}{'worker cores':>13}{'PG cores':>10}"
        f"{'worker ms/round':>16}{'PG ms/round':>12}{'load':>6}"
    )
    for n in args.processes:
        rs = [one(url, n, args) for _ in range(args.repeats)]
        rates = [r["rounds_per_s"] for r in rs]
        print(
            f"{n:>9}  {f'{median(rates):.0f} [{min(rates):.0f}-{max(rates):.0f}]':<27}"
            f"{median([r['worker_cores'] for r in rs]):>13.2f}{median([r['db_cores'] for r in rs]):>10.2f}"
            f"{median([r['worker_ms_per_round'] for r in rs]):>16.3f}{median([r['db_ms_per_round'] for r in rs]):>12.3f}"
            f"{median([r['load'] for r in rs]):>6.1f}"
        )


if __name__ == "__main__":
    main()
