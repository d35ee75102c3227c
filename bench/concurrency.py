"""Many slow LLM calls at once in ONE worker process.

    .venv/bin/python -m bench.concurrency [--levels 100 1000 2000] [--rounds 4] [--latency 2]
                                          [--sdk scripted|openai|anthropic]

For each level N: N runs are created, then dispatched at once through RabbitMQ to a fresh
`python -m workers` process (one process, 8 Dramatiq threads). Each run is an llm step whose
model answers after `--latency` seconds and asks for one tool per round for `--rounds` rounds,
so every run makes rounds+1 model calls back to back. Printed per level:

* peak runs in flight (runs RUNNING at once, sampled from the database)
* achieved model calls/s against the ideal (in-flight runs / latency), over the steady window
* wall time against the ideal (calls per run x latency)
* the worker's peak RSS (VmHWM)
Target (issue #3): at 1,000 runs, >= 80 % of ideal and RSS < 1 GiB.

`--sdk openai|anthropic`: the model is called through that real SDK (Stevora's adapter, not
streamed) over HTTP instead of the in-process scripted provider, against a local server
(bench/real_path.py's asyncio server, in its own process) that answers after `--latency` with a
call of the `effect` tool per round, then a text.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import secrets
import time

from bench.common import bench_database_url, new_workspace
from bench.real_path import serve_many
from stevora.engine import commands
from stevora.engine.brokers import build_broker
from stevora.engine.dispatch import EXECUTE_RUN_ACTOR, DramatiqDispatcher, RecordingDispatcher
from stevora.ids import new_id
from stevora.runtime import Runtime
from stevora.settings import Settings
from tests.conftest import create_definition
from tests.e2e.workerproc import WorkerProcess

BROKER = os.environ.get("STEVORA_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672/")


def peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


async def level(
    rt: Runtime, ws: str, def_id: str, n: int, calls_per_run: int, latency: float, sdk_env: dict[str, str]
) -> None:
    queue = f"bench-{secrets.token_hex(3)}"
    dispatcher = DramatiqDispatcher(build_broker(BROKER), queue)
    rt.dispatcher = RecordingDispatcher()
    runs = [(await commands.create_run(rt, ws, def_id, {"n": i}))[0]["id"] for i in range(n)]
    worker = WorkerProcess(
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
            "STEVORA_WORKER_THREADS": "8",
            **sdk_env,
        },
    )
    try:
        await asyncio.sleep(3)  # let the worker boot
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
        rss = peak_rss_mb(worker.proc.pid)
    finally:
        worker.stop()
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


MODELS = {"openai": "gpt-4o-mini", "anthropic": "claude-haiku-4-5"}


async def main(url: str, levels: list[int], rounds: int, latency: float, sdk: str) -> None:
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
            await level(rt, ws, def_id, n, rounds + 1, latency, sdk_env)
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
    args = parser.parse_args()
    asyncio.run(main(bench_database_url("concurrency"), args.levels, args.rounds, args.latency, args.sdk))
