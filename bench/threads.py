"""Threads (docs/threads.md): message → first model request, and the cost of a turn's history.

    .venv/bin/python -m bench.threads [--messages 60] [--active 100] [--turns 50] [--history-only]

Runs execute in-process (the real RunPool, driver and PostgreSQL; a zero-latency scripted model
that records when each request starts). Printed:

* message → first model request, p50/p99 ms: one thread (messages sent one after another), and
  `--active` threads each sending a message at once (100 turns active together); the baselines
  are the same definition started as plain runs (`commands.create_run`) in the same two shapes,
  and plain runs each with a concurrency key (a thread's turns hold one), so the difference is
  what a thread adds (the thread lock, the concurrency key's claim, the history read).
* the history rebuild of a `--turns`-turn thread, per turn: the bytes the turn sends as history,
  the messages, the SQL statements the rebuild makes (counted, machine-independent: constant in
  the number of turns), and its time, p50 over 20 repeats; then ms per 100 KB of history, which
  must not grow with the turn number; and the bytes the turn's model calls stored (their
  requests) and all turns' up to it: a turn stores what it added, not the history again.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bench.common import bench_database_url, new_workspace, pct
from bench.harness import quiet_json_logging
from stevora.definitions.flow import Concurrency
from stevora.engine import commands, threads
from stevora.engine.inline import InlineDispatcher
from stevora.engine.run_pool import RunPool
from stevora.engine.steps.base import StepExecution
from stevora.engine.steps.llm_thread import thread_history
from stevora.llm.messages import LlmRequest, LlmResponse, ToolCall, Usage
from stevora.llm.router import ProviderRouter
from stevora.llm.scripted_provider import ScriptedProvider
from stevora.runtime import Runtime
from stevora.settings import Settings
from stevora.tasks import TaskRegistry
from stevora.tools import ToolRegistry
from tests.conftest import create_definition


class FirstRequest(ScriptedProvider):
    """A zero-latency model noting when the first request of each run (by its last user message)
    starts. With tools offered it calls the first one after a user message and answers after its
    result: each turn is one tool round, then an answer."""

    def __init__(self) -> None:
        super().__init__()
        self.first: dict[str, float] = {}

    async def complete(self, request: LlmRequest) -> LlmResponse:
        tag = next((m.content for m in reversed(request.messages) if m.role == "user"), "") or ""
        self.first.setdefault(tag, time.perf_counter())
        if request.tools and request.messages[-1].role == "user":
            self._calls += 1
            call = ToolCall(f"call_{self._calls}", request.tools[0].name, '{"order": "o-1"}')
            return LlmResponse(None, [call], Usage(10, 5), request.model, "tool_calls", None, self.name)
        return await super().complete(request)


async def _timed(provider: FirstRequest, tag: str, send: Callable[[], Awaitable[Any]]) -> float:
    started = time.perf_counter()
    await send()
    while tag not in provider.first:  # noqa: ASYNC110 (polled: the provider runs in the pool's tasks)
        await asyncio.sleep(0.0005)
    return (provider.first[tag] - started) * 1000


async def _latencies(
    rt: Runtime, provider: FirstRequest, ws: str, def_id: str, args: argparse.Namespace
) -> None:
    async def idle() -> None:
        while await rt.pool.fetchval(  # noqa: ASYNC110 (the database says when runs end)
            "SELECT count(*) FROM workflow_runs WHERE workspace_id = $1 AND status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED')",
            ws,
        ):
            await asyncio.sleep(0.01)

    thread = await threads.create_thread(rt, ws, def_id, metadata={}, state={}, on_active="enqueue")
    one_thread, one_plain = [], []
    for n in range(args.messages):
        one_thread.append(
            await _timed(provider, f"t1-{n}", lambda n=n: threads.send(rt, ws, thread.id, f"t1-{n}"))
        )
        await idle()
        one_plain.append(
            await _timed(
                provider, f"p1-{n}", lambda n=n: commands.create_run(rt, ws, def_id, {"content": f"p1-{n}"})
            )
        )
        await idle()
    many = [
        await threads.create_thread(rt, ws, def_id, metadata={}, state={}, on_active="enqueue")
        for _ in range(args.active)
    ]
    many_thread = await asyncio.gather(
        *(
            _timed(provider, f"tN-{i}", lambda t=t, i=i: threads.send(rt, ws, t.id, f"tN-{i}"))
            for i, t in enumerate(many)
        )
    )
    await idle()
    many_plain = await asyncio.gather(
        *(
            _timed(
                provider, f"pN-{i}", lambda i=i: commands.create_run(rt, ws, def_id, {"content": f"pN-{i}"})
            )
            for i in range(args.active)
        )
    )
    await idle()
    many_keyed = await asyncio.gather(
        *(
            _timed(
                provider,
                f"kN-{i}",
                lambda i=i: commands.create_run(
                    rt, ws, def_id, {"content": f"kN-{i}"}, concurrency=Concurrency(key=f"k{i}", limit=1)
                ),
            )
            for i in range(args.active)
        )
    )
    await idle()
    print("message -> first model request (ms)          p50      p99")
    for label, values in [
        ("1 thread, one message at a time", one_thread),
        ("  baseline: plain runs", one_plain),
        (f"{args.active} threads, a message each at once", list(many_thread)),
        (f"  baseline: {args.active} plain runs at once", list(many_plain)),
        ("  ... with a concurrency key each (limit 1)", list(many_keyed)),
    ]:
        print(f"  {label:<42} {pct(values, 50):7.2f}  {pct(values, 99):7.2f}")


class Counting:
    """The pool, counting the statements a rebuild sends."""

    def __init__(self, pool: Any) -> None:
        self.pool, self.statements = pool, 0

    async def fetch(self, *args: Any) -> Any:
        self.statements += 1
        return await self.pool.fetch(*args)

    async def fetchval(self, *args: Any) -> Any:
        self.statements += 1
        return await self.pool.fetchval(*args)


async def _history(rt: Runtime, ws: str, def_id: str, args: argparse.Namespace) -> None:
    thread = await threads.create_thread(rt, ws, def_id, metadata={}, state={}, on_active="enqueue")
    run_ids = []
    for n in range(args.turns):
        sent = await threads.send(rt, ws, thread.id, f"Turn {n}: " + "tell me more about the order, " * 8)
        run_ids.append(sent.run_id)
        while await rt.pool.fetchval("SELECT status FROM workflow_runs WHERE id = $1", sent.run_id) not in (  # noqa: ASYNC110
            "COMPLETED",
            "FAILED",
        ):
            await asyncio.sleep(0.005)
    print(f"\nhistory rebuild of a {args.turns}-turn thread (each turn: a tool round, then an answer)")
    print(
        "  turn   messages   history KB   statements   ms p50   ms per 100 KB   stored KB   thread stored KB"
    )
    real_pool = rt.pool
    stored = await rt.pool.fetch(
        "SELECT workflow_run_id, sum(octet_length(request::text)) AS bytes FROM llm_calls "
        "WHERE workflow_run_id = ANY($1::text[]) GROUP BY workflow_run_id",
        run_ids,
    )
    stored_bytes = {r["workflow_run_id"]: r["bytes"] for r in stored}
    for turn in sorted({0, 1, 2, 10, 24, 25, args.turns - 1} & set(range(0, args.turns))):
        ex = StepExecution(
            run_id=run_ids[turn], workspace_id=ws, owner="bench", step_run_id="-", step_name="agent",
            step_index=0, visit=1, attempt=1, input={}, state={}, started_at=None, thread_id=thread.id,
        )  # fmt: skip
        counting = Counting(real_pool)
        rt.pool = counting  # type: ignore[assignment]
        try:
            found = await thread_history(rt, ex)
            history = getattr(found, "messages", found)  # a list before references (a baseline tree)
        finally:
            rt.pool = real_pool
        size = len(json.dumps([m.to_dict() for m in history]).encode())
        times = []
        for _ in range(20):
            started = time.perf_counter()
            await thread_history(rt, ex)
            times.append((time.perf_counter() - started) * 1000)
        ms = statistics.median(times)
        # What the turn's model calls stored (their requests), and all turns' up to this one.
        mine = stored_bytes.get(run_ids[turn], 0)
        upto = sum(stored_bytes.get(r, 0) for r in run_ids[: turn + 1])
        print(
            f"  {turn + 1:>4}   {len(history):>8}   {size / 1024:>10.1f}   {counting.statements:>10}   "
            f"{ms:>6.2f}   {ms / max(size, 1) * 100 * 1024:>13.2f}   {mine / 1024:>9.1f}   {upto / 1024:>16.1f}"
        )


async def main(args: argparse.Namespace, url: str) -> None:
    settings = Settings(database_url=url, lease_s=60, heartbeat_s=20)
    quiet_json_logging(settings)
    provider = FirstRequest()
    tools = ToolRegistry()
    tools.register("lookup", lambda input: {"order": "o-1", "status": "shipped"},
                   parameters={"type": "object", "properties": {"order": {"type": "string"}}})  # fmt: skip
    dispatcher = InlineDispatcher()
    rt = await Runtime.start(
        settings,
        dispatcher=dispatcher,
        providers=ProviderRouter({"scripted": provider}),
        tasks=TaskRegistry(),
        tools=tools,
    )
    pool = RunPool(rt)
    dispatcher.run_pool = pool
    pool.start()
    try:
        ws = await new_workspace(rt.pool)
        def_id = await create_definition(rt, ws, {
            "name": "chat", "version": "1",
            "steps": [{"type": "llm", "name": "agent", "model": "scripted", "systemPrompt": "You help.",
                       "messages": [{"role": "user", "content": "{{input.content}}"}]}],
        })  # fmt: skip
        if not args.history_only:
            await _latencies(rt, provider, ws, def_id, args)
        loop_def = await create_definition(rt, ws, {
            "name": "chat-tools", "version": "1",
            "steps": [{"type": "llm", "name": "agent", "model": "scripted", "maxToolRounds": 5,
                       "systemPrompt": "You help.", "tools": ["lookup"],
                       "messages": [{"role": "user", "content": "{{input.content}}"}]}],
        })  # fmt: skip
        await _history(rt, ws, loop_def, args)
    finally:
        await pool.close()
        await rt.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=60)
    parser.add_argument("--active", type=int, default=100)
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--history-only", action="store_true", help="the history part only")
    asyncio.run(main(parser.parse_args(), bench_database_url("threads")))
