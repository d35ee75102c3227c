"""A `map` step over zero-latency children: children per second and the parent's overhead per item.

    .venv/bin/python -m bench.map_step [--items 1000] [--concurrency 1 8 64]

For each concurrency, one run whose `map` step fans a one-task workflow (the task returns at once)
out over `--items` items, executed by the real RunPool and driver on PostgreSQL (in process, no
broker). Printed per concurrency:

* children per second: items / wall time from the run's creation to its completion;
* the parent's overhead per item: time and statements spent in the map step's own code (its
  `on_waiting`, the hook a child's ending calls, `on_due`, and the batched recording of endings on
  the parent, `map_items.record_endings`) divided by the items — what the fan-out adds to running the
  children themselves. Ending an item (migration 0028's trigger) runs inside the child's own
  terminal statement: its work is in the child's statement and time, not here;
* statements per item in all (children included), and the same count for as many standalone runs
  of the child workflow at the same concurrency (the baseline a map is compared with);
* this process's CPU time per item (per standalone run): what the worker spends, waits excluded.

Statements are counted (every `execute` / `fetch*` on an asyncpg connection), so they do not
depend on the machine; milliseconds and children/s do.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from bench.common import bench_database_url, new_workspace
from stevora.db import map_items
from stevora.engine import commands
from stevora.engine.inline import InlineDispatcher
from stevora.engine.run_pool import RunPool
from stevora.engine.steps import map as map_step
from stevora.ids import new_id
from stevora.llm.router import ProviderRouter
from stevora.logging import configure_logging
from stevora.runtime import Runtime
from stevora.settings import Settings
from stevora.tasks import TaskRegistry
from stevora.tools import ToolRegistry
from tests.conftest import create_definition

_STATEMENTS = ("execute", "executemany", "fetch", "fetchrow", "fetchval")
_in_map = contextvars.ContextVar("in_map", default=False)


class Meter:
    """Counts statements (all, and those issued by the map step's own code) and times the map
    step's code, by wrapping asyncpg's connection methods and the map step's three hooks."""

    def __init__(self) -> None:
        self.statements = 0
        self.map_statements = 0
        self.map_s = 0.0

    def install(self) -> None:
        for name in _STATEMENTS:
            original = getattr(asyncpg.connection.Connection, name)
            setattr(asyncpg.connection.Connection, name, self._counted(original))
        map_step.answer_from_child = self._timed(map_step.answer_from_child)  # type: ignore[assignment]
        if hasattr(map_items, "record_endings"):  # the batched recording (migration 0028)
            map_items.record_endings = self._timed(map_items.record_endings)
        cls = map_step.MapStepType
        cls.on_waiting = self._timed(cls.on_waiting)  # type: ignore[method-assign]
        cls.on_due = self._timed(cls.on_due)  # type: ignore[method-assign]

    def _counted(self, original: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.statements += 1
            if _in_map.get():
                self.map_statements += 1
            return await original(*args, **kwargs)

        return counted

    def _timed(self, fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def timed(*args: Any, **kwargs: Any) -> Any:
            token = _in_map.set(True)
            started = time.perf_counter()
            try:
                return await fn(*args, **kwargs)
            finally:
                self.map_s += time.perf_counter() - started
                _in_map.reset(token)

        return timed

    def snapshot(self) -> tuple[int, int, float]:
        return self.statements, self.map_statements, self.map_s


async def _until_done(pool: asyncpg.Pool, run_ids: list[str]) -> None:
    while True:
        left = await pool.fetchval(
            "SELECT count(*) FROM workflow_runs WHERE id = ANY($1::text[]) AND status NOT IN ('COMPLETED', 'FAILED')",
            run_ids,
        )
        if not left:
            break
        await asyncio.sleep(0.005)
    failed = await pool.fetchval(
        "SELECT count(*) FROM workflow_runs WHERE id = ANY($1::text[]) AND status = 'FAILED'", run_ids
    )
    assert failed == 0, "a benchmark run failed"


async def main(url: str, items: int, levels: list[int]) -> None:
    settings = Settings(database_url=url, lease_s=60, heartbeat_s=20, log_level="WARNING")
    configure_logging(settings)
    tasks = TaskRegistry()
    tasks.register(
        "instant", lambda ctx: {"status": "completed", "stateUpdates": {"n": ctx.workflow_input["n"]}}
    )
    dispatcher = InlineDispatcher()
    rt = await Runtime.start(
        settings, dispatcher=dispatcher, providers=ProviderRouter({}), tasks=tasks, tools=ToolRegistry()
    )
    meter = Meter()
    meter.install()
    try:
        ws = await new_workspace(rt.pool)
        child = await create_definition(
            rt,
            ws,
            {"name": "item", "version": "1", "steps": [{"type": "task", "name": "t", "handler": "instant"}]},
        )
        print(f"map over {items} zero-latency children (one task step each), in process, PostgreSQL")
        print(
            f"{'concurrency':>11} {'children/s':>10} {'map ms/item':>11} {'map stmts/item':>14} "
            f"{'stmts/item':>10} {'cpu ms/item':>11} | {'standalone runs/s':>17} {'stmts/run':>9} "
            f"{'cpu ms/run':>10}"
        )
        for concurrency in levels:
            parent = await create_definition(
                rt,
                ws,
                {
                    "name": new_id("fanout"),
                    "version": "1",
                    "steps": [
                        {
                            "type": "map",
                            "name": "fan",
                            "items": "{{input.numbers}}",
                            "workflow": "item",
                            "input": {"n": "{{item}}"},
                            "concurrency": concurrency,
                        }
                    ],
                },
            )
            # The pool is not the bound: the map's concurrency is (plus the parent itself).
            rt.settings = settings.model_copy(update={"max_concurrent_runs": concurrency + 8})
            pool = RunPool(rt)
            dispatcher.run_pool = pool
            pool.start()
            try:
                s0, m0, t0 = meter.snapshot()
                started, cpu0 = time.perf_counter(), time.process_time()
                run, _ = await commands.create_run(rt, ws, parent, {"numbers": list(range(items))})
                await _until_done(rt.pool, [run["id"]])
                wall, cpu = time.perf_counter() - started, time.process_time() - cpu0
                s1, m1, t1 = meter.snapshot()
                output = await rt.pool.fetchval("SELECT output FROM workflow_runs WHERE id = $1", run["id"])
                assert output["fan"] == [{"n": n} for n in range(items)], "results out of order"
                # Baseline: as many standalone runs of the child workflow, at most `concurrency` at once.
                rt.settings = settings.model_copy(update={"max_concurrent_runs": concurrency})
                dispatcher.run_pool = None  # created undispatched, then handed to the pool at once
                ids = [(await commands.create_run(rt, ws, child, {"n": n}))[0]["id"] for n in range(items)]
                dispatcher.run_pool = pool
                pool._slots = asyncio.Semaphore(concurrency)
                b0 = meter.statements
                base_started, base_cpu0 = time.perf_counter(), time.process_time()
                await asyncio.gather(*(pool.submit(r) for r in ids))
                await _until_done(rt.pool, ids)
                base_wall, base_cpu = time.perf_counter() - base_started, time.process_time() - base_cpu0
                base_statements = meter.statements - b0
            finally:
                await pool.close()
                dispatcher.run_pool = None
            print(
                f"{concurrency:>11} {items / wall:>10.0f} {1000 * (t1 - t0) / items:>11.3f} "
                f"{(m1 - m0) / items:>14.2f} {(s1 - s0) / items:>10.2f} {1000 * cpu / items:>11.3f} | "
                f"{items / base_wall:>17.0f} {base_statements / items:>9.2f} {1000 * base_cpu / items:>10.3f}"
            )
    finally:
        await rt.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    args = parser.parse_args()
    asyncio.run(main(bench_database_url("map_step"), args.items, args.concurrency))
