"""Group commit vs one statement per checkpoint, at 32 and 128 concurrent callers.

    .venv/bin/python -m bench.group_commit [--callers 32 128] [--per-caller 100] [--repeats 3]

Each caller is a run (leased, RUNNING) writing tool-trace checkpoints back to back, as the tool
loop does with a zero-latency tool, through `checkpoints.record_tool_trace`. "single": a
`GroupCommitter` with grouping off (STEVORA_GROUP_COMMIT=false: one statement and one commit per
checkpoint). "grouped": grouping on (the default; stevora/db/group_commit.py), one batch on the
wire at a time.
Printed: checkpoints/s median [min-max], worker CPU and PostgreSQL backend CPU per checkpoint,
rows per statement, load average.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import time

from bench.common import bench_database_url, median
from bench.harness import LoopBench, backend_cpu_s, database_backend_pids
from stevora.db import checkpoints
from stevora.db.checkpoints import ToolTraceRecord
from stevora.db.group_commit import GroupCommitter
from tests.integration.db.test_group_commit import trace

OWNER = "bench-group-commit"
_SEQ = itertools.count(1000)


async def leased_anchors(bench: LoopBench, n: int) -> list[dict[str, str]]:
    level_runs = await bench.create_runs(1, n)
    await bench.execute(level_runs, 64)
    await bench.rt.pool.execute(
        "UPDATE workflow_runs SET status = 'RUNNING', lease_owner = $2, lease_expires_at = now() + interval '1 hour' "
        "WHERE id = ANY($1::text[])",
        level_runs,
        OWNER,
    )
    rows = await bench.rt.pool.fetch(
        "SELECT DISTINCT ON (workflow_run_id) workflow_run_id, step_run_id, id AS llm_call_id FROM llm_calls "
        "WHERE workflow_run_id = ANY($1::text[]) ORDER BY workflow_run_id, round",
        level_runs,
    )
    return [dict(r) for r in rows]


def record(anchor: dict[str, str]) -> ToolTraceRecord:
    return trace(anchor, next(_SEQ))


async def measure(
    bench: LoopBench, anchors: list[dict[str, str]], mode: str, per_caller: int
) -> tuple[float, ...]:
    pool = bench.rt.pool
    gc = GroupCommitter(pool, enabled=mode == "grouped")
    payload = {"toolName": "noop", "durationMs": 0.1}

    async def caller(anchor: dict[str, str]) -> None:
        for _ in range(per_caller):
            await checkpoints.record_tool_trace(
                gc, anchor["workflow_run_id"], OWNER, record(anchor), "TOOL_CALL_COMPLETED", payload
            )

    pids = await database_backend_pids(pool)
    cpu0, db0, t0 = time.process_time(), backend_cpu_s(pids), time.perf_counter()
    await asyncio.gather(*(caller(a) for a in anchors))
    wall = time.perf_counter() - t0
    n = len(anchors) * per_caller
    pids = sorted(set(pids) | set(await database_backend_pids(pool)))
    rows_per_stmt = gc.rows / gc.batches if gc.batches else 1.0
    return (
        n / wall,
        (time.process_time() - cpu0) / n * 1000,
        (backend_cpu_s(pids) - db0) / n * 1000,
        rows_per_stmt,
        os.getloadavg()[0],
    )


async def main(url: str, callers: list[int], per_caller: int, repeats: int) -> None:
    bench = await LoopBench.start(url, hot_pool_size=20)
    try:
        anchors = await leased_anchors(bench, max(callers))
        print(
            "tool-trace checkpoints (CTE: fence + trace + event), asyncpg pool of 20, PostgreSQL on this machine"
        )
        print(f"{'callers':>7} {'mode':<8} {'checkpoints/s median [min-max]':<32}{'worker CPU ms':>14}{'DB CPU ms':>10}"
              f"{'rows/stmt':>10}{'load':>6}")  # fmt: skip
        for c in callers:
            for mode in ("single", "grouped"):
                results = [await measure(bench, anchors[:c], mode, per_caller) for _ in range(repeats)]
                rates = [r[0] for r in results]
                print(
                    f"{c:>7} {mode:<8} {median(rates):>7.0f} [{min(rates):.0f}-{max(rates):.0f}]{'':<14}"
                    f"{median([r[1] for r in results]):>14.3f}{median([r[2] for r in results]):>10.3f}"
                    f"{median([r[3] for r in results]):>10.1f}{median([r[4] for r in results]):>6.1f}"
                )
    finally:
        await bench.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--callers", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--per-caller", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(bench_database_url("group_commit"), args.callers, args.per_caller, args.repeats))
