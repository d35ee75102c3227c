"""Many slow LLM calls at once in ONE worker process.

    .venv/bin/python -m bench.concurrency [--levels 100 1000 2000] [--rounds 4] [--latency 2]
                                          [--sdk scripted|openai|anthropic] [--tool-pool 10] [--threads N]
                                          [--timeline] [--count [--top 40]] [--py-spy FILE]

For each level N: N runs are created, then dispatched at once through RabbitMQ to a fresh
`python -m workers` process (one process, `--threads` Dramatiq threads, default the tree's
`STEVORA_WORKER_THREADS` default). Each run is an llm step whose
model answers after `--latency` seconds and asks for one tool per round for `--rounds` rounds,
so every run makes rounds+1 model calls back to back. Printed per level:

* peak runs in flight (runs RUNNING at once, sampled from the database)
* achieved model calls/s against the ideal (in-flight runs / latency), over the steady window
* wall time against the ideal (calls per run x latency)
* the worker's peak RSS (VmHWM)
* the worker process's CPU (user + system, all its threads) per model call, from dispatch to the
  last run's end, and the load average (the worker shares the cores with PostgreSQL, RabbitMQ,
  this driver and, with `--sdk`, the HTTP server, whose CPU per model call is printed too)
Target (issue #3): at 1,000 runs, >= 80 % of ideal and RSS < 1 GiB.

The tool (`effect`, tests/e2e/crash_tools.py) records its side effect with one INSERT through
its own pool: `--tool-pool` connections (default 10; the module's own 2 limited the tool calls
of 2,000 runs in flight, not Stevora: see docs/benchmarks.md). `--timeline`: model calls ended
per 0.5 s, how far apart the runs started, and each round's time beyond the model's latency.

`--count`: the worker runs under cProfile (every thread; C calls included) and the bench prints
the Python function calls per model call from dispatch to the last run's end (machine-independent;
the profiler slows the worker, so the rate of that pass is not the rate without it), with the
`--top` functions by calls and by own time. `--py-spy FILE`: samples the worker with py-spy
(raw format, `bench/profile_breakdown.py` reads it) from dispatch to the end.

`--sdk openai|anthropic`: the model is called through that real SDK (Stevora's adapter, not
streamed) over HTTP instead of the in-process scripted provider, against a local server
(bench/real_path.py's asyncio server, in its own process) that answers after `--latency` with a
call of the `effect` tool per round, then a text.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import multiprocessing
import os
import pstats
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

from bench.common import bench_database_url, new_workspace
from bench.real_path import serve_many
from stevora.db.database import asyncpg_dsn
from stevora.engine import commands
from stevora.engine.brokers import build_broker
from stevora.engine.dispatch import EXECUTE_RUN_ACTOR, DramatiqDispatcher, RecordingDispatcher
from stevora.ids import new_id
from stevora.runtime import Runtime
from stevora.settings import Settings
from tests.conftest import create_definition
from tests.e2e.workerproc import WorkerProcess

BROKER = os.environ.get("STEVORA_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672/")


@dataclass
class Options:
    count: bool = False  # Python calls per model call (cProfile in the worker)
    top: int = 0  # with count: the top functions
    spy: str | None = None  # py-spy output prefix
    timeline: bool = False  # calls per 0.5 s, start spread, time per round beyond the latency
    tool_pool: int = 10  # connections of the effect tool's own pool (crash_tools.py alone: 2)
    threads: int | None = None  # Dramatiq threads of the worker (None: the tree's default)
    server_pid: int | None = None  # with --sdk: the fake HTTP server's process (its CPU is printed)


async def _nothing(conn: asyncpg.Connection) -> None:
    return None


def _sized_tool_pool() -> None:
    """In the worker (this module is one of its tool modules): the `effect` tool's pool of
    tests/e2e/crash_tools.py gets `BENCH_TOOL_POOL` connections instead of 2, and no reset
    statement each time a connection goes back (its INSERT changes no session state; Stevora's
    own pools skip it the same way)."""
    from tests.e2e import crash_tools

    async def db() -> asyncpg.Pool:
        if crash_tools._pool is None:
            size = int(os.environ["BENCH_TOOL_POOL"])
            crash_tools._pool = await asyncpg.create_pool(
                asyncpg_dsn(os.environ["STEVORA_DATABASE_URL"]), min_size=1, max_size=size, reset=_nothing
            )
        return crash_tools._pool

    crash_tools._db = db


if os.environ.get("BENCH_TOOL_POOL"):
    _sized_tool_pool()


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def profiled_worker() -> None:
    """`python -m bench.concurrency --as-worker`: `python -m workers` with cProfile in every thread
    (installed as each thread starts); SIGUSR1 writes a snapshot of all threads' counts to
    `$BENCH_PROFILE_OUT.<k>` (k = 0, 1, ...) without stopping the profilers."""
    import cProfile
    import threading

    profiles: list[cProfile.Profile] = []
    lock = threading.Lock()
    snapshots = 0
    collected = [[0, 0.0] for _ in range(3)]  # per generation: collections, seconds
    started: list[float] = []

    def gc_timer(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[:] = [time.thread_time()]
        elif started:
            collected[info["generation"]][0] += 1
            collected[info["generation"]][1] += time.thread_time() - started[0]

    gc.callbacks.append(gc_timer)

    def start_profiling(*_: object) -> None:
        profile = cProfile.Profile()
        with lock:
            profiles.append(profile)
        profile.enable()  # replaces this hook as the thread's profile function

    def snapshot(*_: object) -> None:
        nonlocal snapshots
        with lock:
            merged: pstats.Stats | None = None
            for profile in profiles:
                profile.snapshot_stats()
                merged = pstats.Stats(profile) if merged is None else merged.add(profile)
            if merged is not None:
                merged.dump_stats(f"{os.environ['BENCH_PROFILE_OUT']}.{snapshots}")
            with open(f"{os.environ['BENCH_PROFILE_OUT']}.{snapshots}.gc", "w") as f:
                json.dump({"collected": collected, "objects": len(gc.get_objects())}, f)
            snapshots += 1

    signal.signal(signal.SIGUSR1, snapshot)
    threading.setprofile(start_profiling)
    start_profiling()
    import runpy

    runpy.run_module("workers", run_name="__main__")


def stats_delta(before: str, after: str) -> dict[tuple[str, int, str], tuple[int, float]]:
    """Per function: (calls, own seconds) between two snapshots."""
    a = pstats.Stats(before).stats  # type: ignore[attr-defined]
    b = pstats.Stats(after).stats  # type: ignore[attr-defined]
    out = {}
    for func, (_cc, nc, tt, _ct, _callers) in b.items():
        nc0, tt0 = (a[func][1], a[func][2]) if func in a else (0, 0.0)
        if nc > nc0:
            out[func] = (nc - nc0, tt - tt0)
    return out


def print_counts(delta: dict[tuple[str, int, str], tuple[int, float]], calls: int, top: int) -> None:
    total = sum(nc for nc, _ in delta.values())
    own = sum(tt for _, tt in delta.values())
    print(
        f"         python calls per model call {total / calls:8.0f}   (profiled CPU {1000 * own / calls:.2f} ms)"
    )
    if not top:
        return

    def name(f: tuple[str, int, str]) -> str:
        path, line, fn = f
        short = "/".join(path.split("/")[-2:]) if path != "~" else ""
        return f"{short}:{line}({fn})" if short else fn

    print("         top by calls per model call:")
    for f, (nc, tt) in sorted(delta.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"           {nc / calls:8.1f}  {1000 * tt / calls:6.3f} ms  {name(f)}")
    print("         top by own time per model call:")
    for f, (nc, tt) in sorted(delta.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"           {nc / calls:8.1f}  {1000 * tt / calls:6.3f} ms  {name(f)}")


async def commits(rt: Runtime) -> int:
    """Transactions committed in the bench database so far (statistics are flushed lazily: read
    after a pause)."""
    await asyncio.sleep(1.1)
    await rt.pool.execute("SELECT pg_stat_clear_snapshot()")
    return int(
        await rt.pool.fetchval(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()"
        )
    )


async def backend_cpu(rt: Runtime, before: dict[int, float], mine: set[int]) -> dict[int, float]:
    """CPU seconds of the worker's PostgreSQL backends (those of the bench database but not in
    `mine`), minus `before`."""
    pids = await rt.pool.fetch("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
    out = {}
    for r in pids:
        if r["pid"] in mine:
            continue
        try:
            out[r["pid"]] = cpu_s(r["pid"]) - before.get(r["pid"], 0.0)
        except OSError:
            pass
    return out


def print_gc(profile_out: str, calls: int) -> None:
    """The worker's garbage collections between the two snapshots."""
    gc0, gc1 = (json.loads(Path(f"{profile_out}.{k}.gc").read_text()) for k in (0, 1))
    per_gen = [(b[0] - a[0], b[1] - a[1]) for a, b in zip(gc0["collected"], gc1["collected"], strict=True)]
    print(
        "         GC (CPU of the thread collecting): collections per 1,000 model calls (gen 0/1/2) "
        + "/".join(f"{1000 * n / calls:.1f}" for n, _ in per_gen)
        + f", {1000 * sum(t for _, t in per_gen) / calls:.3f} ms per model call; "
        f"objects tracked at the end {gc1['objects']:,}"
    )


def peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


async def level(
    rt: Runtime,
    ws: str,
    def_id: str,
    n: int,
    calls_per_run: int,
    latency: float,
    sdk_env: dict[str, str],
    opts: Options,
) -> None:
    count, top, timeline, tool_pool = opts.count, opts.top, opts.timeline, opts.tool_pool
    spy = f"{opts.spy}.{n}" if opts.spy else None
    queue = f"bench-{secrets.token_hex(3)}"
    profile_out = os.path.join(tempfile.mkdtemp(prefix="bench-conc-"), "prof")
    dispatcher = DramatiqDispatcher(build_broker(BROKER), queue)
    rt.dispatcher = RecordingDispatcher()
    runs = [(await commands.create_run(rt, ws, def_id, {"n": i}))[0]["id"] for i in range(n)]
    # The backends open now are this driver's: the worker's are those that appear later.
    mine = {
        r["pid"]
        for r in await rt.pool.fetch("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
    }
    worker = (_profiled if count else WorkerProcess)(
        rt.settings.database_url,
        BROKER,
        queue,
        extra_env={
            "STEVORA_SCRIPTED_LATENCY_S": str(latency),
            "STEVORA_HOT_POOL_SIZE": "20",
            "STEVORA_LEASE_S": "30",
            "STEVORA_HEARTBEAT_S": "5",
            "STEVORA_UNDISPATCHED_GRACE_S": "600",
            "STEVORA_MAX_CONCURRENT_RUNS": str(max(2000, n)),
            # tests/e2e/workerproc.py sets 4 threads for the tests: the bench runs what a tree
            # deploys, its own default, unless told otherwise.
            "STEVORA_WORKER_THREADS": str(opts.threads or Settings.model_fields["worker_threads"].default),
            **sdk_env,
            **({"BENCH_PROFILE_OUT": profile_out} if count else {}),
            **(
                {
                    "BENCH_TOOL_POOL": str(tool_pool),
                    "STEVORA_TOOL_MODULES": json.dumps(["tests.e2e.crash_tools", "bench.concurrency"]),
                }
                if tool_pool != 2
                else {}
            ),
        },
    )
    spy_proc = None
    try:
        await asyncio.sleep(8 if count else 3)  # let the worker boot
        pid = worker.proc.pid
        if count:
            os.kill(pid, signal.SIGUSR1)
            await asyncio.sleep(1)
        if spy:
            spy_proc = subprocess.Popen(  # noqa: ASYNC220 - started once, before the runs are dispatched
                [
                    "py-spy",
                    "record",
                    "--pid",
                    str(pid),
                    "--rate",
                    "200",
                    "--format",
                    "raw",
                    "--nonblocking",
                    "-o",
                    spy,
                    "--threads",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env={**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"},
            )
        pg0 = await backend_cpu(rt, {}, mine)
        xact0 = await commits(rt)
        cpu0 = cpu_s(pid)
        server0 = cpu_s(opts.server_pid) if opts.server_pid else 0.0
        t0 = time.perf_counter()
        await asyncio.gather(*(asyncio.to_thread(dispatcher.send, EXECUTE_RUN_ACTOR, r) for r in runs))
        in_flight_peak = 0
        while True:
            row = await rt.pool.fetchrow(
                "SELECT count(*) FILTER (WHERE status IN ('COMPLETED', 'FAILED')) AS done, "
                "count(*) FILTER (WHERE status = 'RUNNING') AS running FROM workflow_runs WHERE id = ANY($1::text[])",
                runs,
            )
            in_flight_peak = max(in_flight_peak, row["running"])
            if row["done"] == n:
                break
            if time.perf_counter() - t0 > calls_per_run * latency * 6 + 60:
                raise SystemExit(f"level {n}: only {row['done']} runs finished; log: {worker.log_tail()}")
            await asyncio.sleep(0.2)
        wall = time.perf_counter() - t0
        cpu = cpu_s(pid) - cpu0
        server_cpu = cpu_s(opts.server_pid) - server0 if opts.server_pid else None
        pg = sum((await backend_cpu(rt, pg0, mine)).values())
        load = os.getloadavg()[0]
        if count:
            os.kill(pid, signal.SIGUSR1)
            await asyncio.sleep(3)
        rss = peak_rss_mb(worker.proc.pid)
    finally:
        if spy_proc is not None:
            spy_proc.send_signal(signal.SIGINT)
            spy_proc.wait(30)
        worker.stop()
    xacts = await commits(rt) - xact0  # after the worker's exit: its backends flushed their counts
    failed = await rt.pool.fetchval(
        "SELECT count(*) FROM workflow_runs WHERE id = ANY($1::text[]) AND status = 'FAILED'", runs
    )
    # Steady window: from the first model call + one latency to the last call - one latency.
    stamps = await rt.pool.fetchrow(
        "SELECT min(created_at) AS first, max(created_at) AS last FROM llm_calls WHERE workflow_run_id = ANY($1::text[])",
        runs,
    )
    lo = stamps["first"].timestamp() + latency
    hi = stamps["last"].timestamp() - latency
    in_window = await rt.pool.fetchval(
        "SELECT count(*) FROM llm_calls WHERE workflow_run_id = ANY($1::text[]) "
        "AND created_at BETWEEN to_timestamp($2) AND to_timestamp($3)",
        runs,
        lo,
        hi,
    )
    achieved = in_window / (hi - lo) if hi > lo else float("nan")
    ideal = n / latency
    print(
        f"  {n:>5} runs: peak in flight {in_flight_peak:>5}   calls/s {achieved:7.1f} of ideal {ideal:7.1f} "
        f"({100 * achieved / ideal:5.1f} %)   wall {wall:6.1f} s vs ideal {calls_per_run * latency:.0f} s   "
        f"peak RSS {rss:6.0f} MiB   failed {failed}"
    )
    calls = n * calls_per_run
    print(
        f"         worker CPU {cpu:6.1f} s = {1000 * cpu / calls:5.2f} ms per model call "
        f"({cpu / wall:4.2f} cores), its PostgreSQL backends {1000 * pg / calls:5.2f} ms   load average {load:4.1f}"
    )
    # One process runs its Python on one core at a time (the GIL; only its system calls and the
    # C code that lets go of the GIL run beside it): at this CPU per call it cannot make much more
    # than 1 / (CPU per call) calls a second, whatever the latency and the runs in flight.
    ceiling = calls / cpu if cpu else float("inf")
    print(
        f"         one core's ceiling at that CPU: {ceiling:7.1f} calls/s = {100 * ceiling / ideal:5.1f} % of ideal "
        "(one process cannot go much past it)"
    )
    if server_cpu is not None:
        print(
            f"         the fake HTTP server's CPU {server_cpu:5.1f} s = {1000 * server_cpu / calls:5.2f} ms "
            f"per model call ({server_cpu / wall:4.2f} cores)"
        )
    print(
        f"         transactions per model call {xacts / calls:5.2f} "
        "(the database's, this driver's polls and the worker's shutdown included)"
    )
    if timeline:
        per = await rt.pool.fetch(
            "SELECT floor(extract(epoch FROM created_at - $2::timestamptz) * 2)::int AS half, count(*) AS calls "
            "FROM llm_calls WHERE workflow_run_id = ANY($1::text[]) GROUP BY 1 ORDER BY 1",
            runs,
            stamps["first"],
        )
        print("         model calls ended per 0.5 s: " + " ".join(str(r["calls"]) for r in per))
        # Where the wall time goes: when runs started (the claim) and each round's time beyond
        # the model's latency (checkpoints, tool call, waiting for the event loop / a connection).
        spread = await rt.pool.fetchrow(
            "WITH c AS (SELECT workflow_run_id, created_at, "
            "  extract(epoch FROM created_at - lag(created_at) OVER (PARTITION BY workflow_run_id ORDER BY created_at)) AS gap "
            "  FROM llm_calls WHERE workflow_run_id = ANY($1::text[])), "
            "s AS (SELECT extract(epoch FROM started_at - min(started_at) OVER ()) AS start, "
            "  extract(epoch FROM completed_at - started_at) AS took FROM workflow_runs WHERE id = ANY($1::text[])) "
            "SELECT (SELECT percentile_cont(ARRAY[0.5, 0.9, 1]) WITHIN GROUP (ORDER BY start) FROM s) AS starts, "
            "(SELECT percentile_cont(ARRAY[0.5, 0.9, 1]) WITHIN GROUP (ORDER BY took) FROM s) AS took, "
            "(SELECT percentile_cont(ARRAY[0.5, 0.9, 0.99]) WITHIN GROUP (ORDER BY gap - $2) "
            "  FROM c WHERE gap IS NOT NULL) AS extra",
            runs,
            latency,
        )

        def fmt(xs: list[float]) -> str:
            return "/".join(f"{x:.2f}" for x in xs)

        print(
            f"         runs started after the first (p50/p90/max) {fmt(spread['starts'])} s; a run took "
            f"{fmt(spread['took'])} s; a round beyond the latency (p50/p90/p99) {fmt(spread['extra'])} s"
        )
    if count:
        print_counts(stats_delta(f"{profile_out}.0", f"{profile_out}.1"), calls, top)
        print_gc(profile_out, calls)


def _profiled(*args: Any, **kwargs: Any) -> WorkerProcess:
    """A WorkerProcess whose `python -m workers` is `python -m bench.concurrency --as-worker`."""
    popen = subprocess.Popen

    def profiled_popen(argv: list[str], **kw: Any) -> subprocess.Popen[bytes]:
        assert argv[1:] == ["-m", "workers"], argv
        return popen([argv[0], "-m", "bench.concurrency", "--as-worker"], **kw)

    setattr(subprocess, "Popen", profiled_popen)  # noqa: B010 - tests/e2e/workerproc.py calls subprocess.Popen
    try:
        return WorkerProcess(*args, **kwargs)
    finally:
        setattr(subprocess, "Popen", popen)  # noqa: B010


MODELS = {"openai": "gpt-4o-mini", "anthropic": "claude-haiku-4-5"}


async def main(
    url: str,
    levels: list[int],
    rounds: int,
    latency: float,
    sdk: str,
    opts: Options,
) -> None:
    settings = Settings(database_url=url, hot_pool_size=10)
    rt = await Runtime.start(settings, dispatcher=RecordingDispatcher())
    ws = await new_workspace(rt.pool)
    def_id = await create_definition(
        rt,
        ws,
        {
            "name": "bench-concurrency",
            "version": new_id("v"),
            "steps": [
                {
                    "type": "llm",
                    "name": "agent",
                    "model": MODELS.get(sdk, f"scripted:rounds={rounds}"),
                    "maxToolRounds": max(rounds, 1),
                    "messages": [{"role": "user", "content": "run {{input.n}}"}],
                    "tools": ["effect"],
                }
            ],
        },
    )
    await rt.pool.execute(
        "CREATE TABLE IF NOT EXISTS test_side_effects (idempotency_key text PRIMARY KEY, executions int NOT NULL)"
    )
    print(
        f"one worker process, model latency {latency:.1f} s, {rounds} tool rounds + 1 answer per run (RabbitMQ), "
        f"model: {sdk if sdk == 'scripted' else sdk + ' SDK over HTTP'}"
    )
    server = None
    sdk_env: dict[str, str] = {}
    if sdk != "scripted":
        parent, child = multiprocessing.Pipe()
        server = multiprocessing.get_context("spawn").Process(
            target=serve_many, args=(child, latency, rounds, "effect"), daemon=True
        )
        server.start()
        opts.server_pid = server.pid
        base_url = parent.recv()
        prefix = sdk.upper()
        sdk_env = {
            f"{prefix}_API_KEY": "bench-key",
            f"{prefix}_BASE_URL": f"{base_url}/v1" if sdk == "openai" else base_url,
            "STEVORA_SCRIPTED_LATENCY_S": "0",
            "STEVORA_LLM_STREAM": "false",  # the server answers JSON bodies, not event streams
        }
    try:
        for n in levels:
            await level(rt, ws, def_id, n, rounds + 1, latency, sdk_env, opts)
    finally:
        await rt.close()
        if server is not None:
            parent.send("stop")
            server.join(5)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--levels", type=int, nargs="+", default=[100, 1000, 2000])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--latency", type=float, default=2.0)
    parser.add_argument("--sdk", choices=["scripted", "openai", "anthropic"], default="scripted")
    parser.add_argument("--count", action="store_true", help="Python calls per model call (cProfile)")
    parser.add_argument("--top", type=int, default=0, help="with --count: the top functions")
    parser.add_argument("--py-spy", dest="spy", help="py-spy raw output file prefix (.<level> appended)")
    parser.add_argument("--timeline", action="store_true", help="model calls ended per 0.5 s")
    parser.add_argument(
        "--tool-pool",
        type=int,
        default=10,
        help="connections of the effect tool's own pool (crash_tools.py alone: 2)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        help="Dramatiq threads of the worker (STEVORA_WORKER_THREADS; default: the tree's own default)",
    )
    parser.add_argument("--as-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.as_worker:
        profiled_worker()
    else:
        asyncio.run(
            main(
                bench_database_url("concurrency"),
                args.levels,
                args.rounds,
                args.latency,
                args.sdk,
                Options(args.count, args.top, args.spy, args.timeline, args.tool_pool, args.threads),
            )
        )
