"""Tool-loop throughput and per-round overhead, with the per-run fixed cost beside it.

    .venv/bin/python -m bench.tool_loop [--rounds 20 5] [--concurrency 1 32 128] [--repeats 3]
                                        [--waves 3] [--uvloop] [--codec orjson|stdlib]
                                        [--group-commit on|off] [--gc worker|default]

A zero-latency scripted model asks for one tool per round, the tool returns at once: all the
time is Stevora's (see bench/harness.py for what is timed: runs are created before the window,
the window closes when the RunPool goes idle). Printed:

* rounds/s per (rounds per run, concurrency): median [min-max] over repeats, with the worker
  process's CPU and the PostgreSQL backends' CPU per round, and the load average
* per-round overhead p50/p99 at concurrency 1, round 1 vs the last round
* the per-run fixed cost (claim + start, step transitions, completion + webhooks outbox) in ms
  of worker and database CPU, from the two round counts (cost = fixed + rounds x per-round),
  and each phase's wall time at concurrency 1
* a bare asyncpg transaction (trace row + event row) for scale

Dispatch goes through an in-process dispatcher (no broker publish): in production add one
publish per run (~1.3 ms per hop over RabbitMQ, measured when the engine was designed, mostly in the API
process; docs/architecture.md).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import secrets
import statistics
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import asyncpg

from bench.common import bench_database_url, median, pct
from bench.counts import Counts, Probe, by_area, top_functions
from bench.harness import Level, LoopBench
from stevora.db import checkpoints, runs, transitions
from stevora.engine.driver import RunDriver
from stevora.ids import new_id
from stevora.tuning import tune_gc


async def bare_transactions(pool: asyncpg.Pool, anchor: asyncpg.Record, n: int) -> tuple[float, float]:
    """Mean ms of (a) BEGIN; INSERT trace; INSERT event; COMMIT and (b) the same as one CTE."""
    run_id, step_run_id, llm_call_id = anchor["workflow_run_id"], anchor["step_run_id"], anchor["llm_call_id"]
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
        tx_ms = statistics.mean(timings[n // 10 :]) * 1000
        timings.clear()
        for _ in range(n):
            seq += 1
            t0 = time.perf_counter()
            await conn.execute(
                cte_sql,
                *(new_id("tt"), run_id, step_run_id, llm_call_id, seq, {"a": 1}, {"ok": True}, f"k{seq}"),
                *(new_id("evt"), seq, payload),
            )
            timings.append(time.perf_counter() - t0)
        cte_ms = statistics.mean(timings[n // 10 :]) * 1000
    return tx_ms, cte_ms


# -- phase clock: wall time of each fixed-cost step at concurrency 1 ------------------------------

PHASES: list[tuple[str, Any, str]] = [
    ("claim + start (run, first step RUNNING)", transitions, "claim"),
    ("re-read run + step (after a retry etc.)", runs, "get_run"),
    ("re-read run + step (after a retry etc.)", runs, "get_step_run"),
    ("begin step (later steps, retries)", RunDriver, "_begin"),
    ("load committed rounds (resumed visits)", checkpoints, "load_rounds"),
    ("complete last step + run + outbox", transitions, "complete_last_step"),
]


@contextmanager
def phase_clock() -> Iterator[dict[str, float]]:
    spent: dict[str, float] = defaultdict(float)
    saved = []
    for label, owner, name in PHASES:
        original = getattr(owner, name)
        saved.append((owner, name, original))

        def timed(
            *args: Any, __f: Callable[..., Awaitable[Any]] = original, __l: str = label, **kw: Any
        ) -> Awaitable[Any]:
            async def call() -> Any:
                t0 = time.perf_counter()
                try:
                    return await __f(*args, **kw)
                finally:
                    spent[__l] += time.perf_counter() - t0

            return call()

        setattr(owner, name, timed)
    try:
        yield spent
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


# -- counts: what a round costs, independent of the machine -----------------------------------------


async def count_levels(
    bench: LoopBench, args: argparse.Namespace
) -> dict[tuple[int, int], tuple[Counts, Level]]:
    """One counted level per (rounds, concurrency), and the growth level (key (rounds, 0))."""
    probe = Probe()
    bench.probe = bench.provider.probe = probe
    out: dict[tuple[int, int], tuple[Counts, Level]] = {}
    try:
        plan = [(r, c, max(8, c)) for r in args.rounds for c in args.concurrency]
        if args.growth:
            plan.append((args.growth, 0, 2))
        for rounds, c, runs in plan:
            probe.counts = Counts()
            bench.provider.call_counts.clear()
            level = await bench.level(rounds, max(c, 1), runs)
            level.call_counts = {k: list(v) for k, v in bench.provider.call_counts.items()}  # type: ignore[attr-defined]
            out[(rounds, c)] = (probe.counts, level)
    finally:
        bench.probe = bench.provider.probe = None
    return out


def print_counts(counted: dict[tuple[int, int], tuple[Counts, Level]], args: argparse.Namespace) -> None:
    wakeups = any(counts.selects for counts, _ in counted.values())
    print(
        "per round, counted (machine-independent; the level's runs' fixed cost spread over their rounds): "
        "function calls = Python frames entered + builtin calls (cProfile's count), of them the bench's "
        "stand-ins (scripted model, noop tool); statements, round trips and commits on asyncpg connections"
        + (
            "; event-loop polls and sleeps (asyncio's selector)"
            if wakeups
            else "; wake-ups: run without --uvloop"
        )
    )
    print(
        f"{'rounds/run':>10} {'conc':>5} {'calls':>8} {'python':>8} {'builtin':>8} {'bench':>6} "
        f"{'stmts':>6} {'trips':>6} {'commits':>7} {'polls':>6} {'sleeps':>6}"
    )
    for (rounds, c), (n, level) in sorted(counted.items(), key=lambda kv: (-kv[0][0], kv[0][1])):
        if c == 0:
            continue
        r = level.total_rounds
        print(
            f"{rounds:>10} {c:>5} {n.calls / r:>8.0f} {n.py / r:>8.0f} {n.c / r:>8.0f} {n.own / r:>6.0f} "
            f"{n.statements / r:>6.2f} {n.round_trips / r:>6.2f} {n.commits / r:>7.2f} "
            f"{n.selects / r if wakeups else float('nan'):>6.1f} {n.sleeps / r if wakeups else float('nan'):>6.1f}"
        )
    if args.top:
        for (rounds, c), (n, level) in sorted(counted.items()):
            if c == 0:
                continue
            print(f"  calls by module, per round ({rounds} rounds, concurrency {c}):")
            for line in by_area(n, level.total_rounds):
                print("    " + line)
            print(f"  Python functions entered most, per round ({rounds} rounds, concurrency {c}):")
            for line in top_functions(n.by_code, level.total_rounds, args.top):
                print("    " + line)
            print(f"  builtin calls by calling function, per round ({rounds} rounds, concurrency {c}):")
            for line in top_functions(n.c_by_code, level.total_rounds, args.top):
                print("    " + line)


def print_growth(timed: Level | None, counted: tuple[Counts, Level] | None, rounds: int) -> None:
    if not rounds:
        return
    marks = sorted({1, 2, min(20, rounds), rounds // 2, rounds})
    print(f"  cost of round k in {rounds}-round runs at concurrency 1 (round k: from model call k to k+1):")
    if timed is not None:
        ms = "  ".join(f"k={k} {median(timed.by_index.get(k, [])):.3f}" for k in marks)
        print(f"    wall ms p50 ({timed.runs} runs): {ms}")
    if counted is not None:
        per_run = getattr(counted[1], "call_counts", {})
        by_k: dict[int, list[float]] = defaultdict(list)
        for stamps in per_run.values():
            for k in range(1, len(stamps)):
                by_k[k].append(stamps[k] - stamps[k - 1])
        calls = "  ".join(f"k={k} {median([float(x) for x in by_k.get(k, [])]):.0f}" for k in marks)
        print(f"    function calls: {calls}")
        print(f"    last round / first round (calls): {median(by_k[rounds]) / median(by_k[1]):.2f}x")
    if timed is not None:
        first, last = median(timed.by_index.get(1, [])), median(timed.by_index.get(rounds, []))
        print(f"    last round / first round (wall p50): {last / first:.2f}x")


# -- report -----------------------------------------------------------------------------------------


def spread(values: list[float], fmt: str = "{:.0f}") -> str:
    if len(values) == 1:
        return fmt.format(values[0])
    return f"{fmt.format(median(values))} [{fmt.format(min(values))}-{fmt.format(max(values))}]"


def per_run_ms(levels: list[Level], attr: str) -> float:
    return median([getattr(lv, attr) / lv.runs * 1000 for lv in levels])


async def main(args: argparse.Namespace, url: str) -> None:
    bench = await LoopBench.start(url, hot_pool_size=args.hot_pool, group_commit=args.group_commit == "on")
    if args.gc == "worker":
        # As `stevora worker` does once started (workers/edge.py): the start-up heap frozen, a
        # larger generation-0 threshold. Without it the collector rescans that heap every 700
        # allocations, a cost the production worker does not pay (about 10 % of the bench's CPU).
        tune_gc()
    if args.cprofile:
        # Process CPU as the clock: on a busy machine wall time would charge preemption to
        # whichever function happened to be running.
        bench.profiler = cProfile.Profile(time.process_time)
    results: dict[tuple[int, int], list[Level]] = defaultdict(list)
    phases: dict[int, dict[str, float]] = {}
    phase_runs: dict[int, int] = {}
    try:
        # Warm up caches, statements and connections: at the highest concurrency, so that the
        # pool has grown to its size before anything is timed or counted (opening a connection
        # costs about 600 Python calls, once per connection of a worker's life).
        top = max(8, *args.concurrency)
        for rounds in args.rounds:
            await bench.level(rounds, top, max(16, top))
        for _ in range(args.repeats):
            for rounds in args.rounds:
                for c in args.concurrency:
                    n = max(8, c * args.waves)
                    results[(rounds, c)].append(await bench.level(rounds, c, n))
        for rounds in args.rounds if args.repeats else ():
            with phase_clock() as spent:
                await bench.level(rounds, 1, 8)
            phases[rounds], phase_runs[rounds] = dict(spent), 8
        growth: Level | None = None
        if args.growth and args.repeats:
            # Timed, not counted: does a round's cost grow with the round number?
            growth = await bench.level(args.growth, 1, args.growth_runs)
        counted = await count_levels(bench, args)
        if args.repeats:
            anchor = await bench.rt.pool.fetchrow(
                "SELECT workflow_run_id, step_run_id, llm_call_id FROM tool_trace LIMIT 1"
            )
            tx_ms, cte_ms = await bare_transactions(bench.rt.pool, anchor, 1000)
    finally:
        await bench.close()
    print_counts(counted, args)
    print_growth(growth, counted.get((args.growth, 0)), args.growth)
    if not args.repeats:
        return
    if bench.profiler is not None:
        bench.profiler.dump_stats(args.cprofile)
        checkpoints_n = sum(lv.runs * (2 * lv.rounds + 1) for levels in results.values() for lv in levels)
        print(f"cProfile written to {args.cprofile}: {checkpoints_n} checkpoints in the repeated levels")

    loop_name = "uvloop" if args.uvloop else "asyncio"
    print(
        f"tool loop: one tool call per round, zero-latency model, PostgreSQL; event loop {loop_name}, "
        f"JSON codec {args.codec}; group commit {args.group_commit}; collector {args.gc}; "
        f"{args.repeats} repeats; {os.cpu_count()} CPUs"
    )
    print(
        f"{'rounds/run':>10} {'conc':>5} {'runs':>5}  {'rounds/s median [min-max]':<28}"
        f"{'worker CPU ms/round':>20} {'DB CPU ms/round':>16}  load"
    )
    for (rounds, c), levels in sorted(results.items(), key=lambda kv: (-kv[0][0], kv[0][1])):
        print(
            f"{rounds:>10} {c:>5} {levels[0].runs:>5}  {spread([lv.rounds_per_s for lv in levels]):<28}"
            f"{median([lv.worker_cpu_s / lv.total_rounds * 1000 for lv in levels]):>20.3f}"
            f"{median([lv.db_cpu_s / lv.total_rounds * 1000 for lv in levels]):>16.3f}"
            f"  {spread([lv.load for lv in levels], '{:.1f}')}"
        )
    for rounds in args.rounds:
        serial = results.get((rounds, 1), [])
        per_round = [x for lv in serial for x in lv.per_round_ms]
        if per_round:
            first = [x for lv in serial for x in lv.by_index.get(1, [])]
            last = [x for lv in serial for x in lv.by_index.get(rounds, [])]
            print(
                f"  {rounds} rounds, concurrency 1: per-round p50 {median(per_round):.3f} ms  "
                f"p99 {pct(per_round, 99):.3f} ms; round 1 p50 {median(first):.3f} ms, "
                f"round {rounds} p50 {median(last):.3f} ms"
            )
    print(
        f"  bare asyncpg tx (BEGIN; INSERT trace; INSERT event; COMMIT): {tx_ms:.3f} ms   one CTE: {cte_ms:.3f} ms"
    )
    print(
        f"  create_run (one statement + dispatch hint, before the window): {median(bench.create_s) * 1000:.3f} ms p50"
    )
    gc = bench.rt.committer
    print(
        f"  checkpoints: {gc.rows} rows in {gc.batches} statements ({gc.rows / max(gc.batches, 1):.1f} per statement)"
    )

    if len(args.rounds) >= 2:
        lo, hi = min(args.rounds), max(args.rounds)
        print(
            f"per-run fixed cost vs per-round cost (cost per run = fixed + rounds x per-round; {lo} and {hi} rounds)"
        )
        for c in args.concurrency:
            a, b = results.get((lo, c)), results.get((hi, c))
            if not a or not b:
                continue
            for label, attr in (("worker CPU", "worker_cpu_s"), ("DB CPU", "db_cpu_s")):
                ra, rb = per_run_ms(a, attr), per_run_ms(b, attr)
                slope = (rb - ra) / (hi - lo)
                print(
                    f"  concurrency {c:>3} {label:<10}: fixed {ra - lo * slope:6.2f} ms/run   "
                    f"per round {slope:6.3f} ms   (a {lo}-round run {ra:.2f} ms, {hi}-round {rb:.2f} ms)"
                )
            if c == 1:
                wa = median([lv.wall_s / lv.runs * 1000 for lv in a])
                wb = median([lv.wall_s / lv.runs * 1000 for lv in b])
                slope = (wb - wa) / (hi - lo)
                print(
                    f"  concurrency   1 wall      : fixed {wa - lo * slope:6.2f} ms/run   per round {slope:6.3f} ms"
                )
    print("fixed-cost phases, wall ms per run at concurrency 1 (instrumented runs):")
    labels = list(dict.fromkeys(label for label, _, _ in PHASES))
    print("  " + f"{'phase':<40}" + "".join(f"{f'{r} rounds':>12}" for r in args.rounds))
    for label in labels:
        cells = "".join(f"{phases[r].get(label, 0.0) / phase_runs[r] * 1000:>12.3f}" for r in args.rounds)
        print(f"  {label:<40}{cells}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, nargs="+", default=[20, 5])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32, 128])
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats (0: the counts only)")
    parser.add_argument("--waves", type=int, default=3, help="runs per level = concurrency x waves (min 8)")
    parser.add_argument("--hot-pool", type=int, default=20, help="asyncpg pool size (STEVORA_HOT_POOL_SIZE)")
    parser.add_argument("--uvloop", action="store_true", help="run on uvloop instead of asyncio's loop")
    parser.add_argument(
        "--group-commit", choices=["on", "off"], default="on", help="STEVORA_GROUP_COMMIT (default on)"
    )
    parser.add_argument("--cprofile", metavar="FILE", help="cProfile the timed windows (process CPU clock)")
    parser.add_argument(
        "--growth",
        type=int,
        default=100,
        help="rounds per run of the round-k level at concurrency 1 (0: skip)",
    )
    parser.add_argument("--growth-runs", type=int, default=5, help="runs of the timed round-k level")
    parser.add_argument("--top", type=int, default=0, help="print the N functions entered most per round")
    parser.add_argument("--codec", choices=["default", "stdlib", "orjson"], default="default")
    parser.add_argument(
        "--gc",
        choices=["worker", "default"],
        default="worker",
        help="worker: the production worker's collector tuning (stevora.tuning.tune_gc); default: CPython's",
    )
    return parser.parse_args()


def run(args: argparse.Namespace) -> None:
    from bench.levers import use_codec

    args.codec = use_codec(args.codec)
    url = bench_database_url("tool_loop")
    if args.uvloop:
        import uvloop

        uvloop.run(main(args, url))
    else:
        asyncio.run(main(args, url))


if __name__ == "__main__":
    run(parse_args())
