"""The tool-loop benchmark's moving parts, shared by `bench.tool_loop` and `bench.scale_out`.

A zero-latency scripted model asks for one tool per round (`scripted:rounds=N`) and the tool
returns at once, so all the time is Stevora's: checkpoints, transitions, transcript rebuilds.
Runs execute through the real RunPool and driver on PostgreSQL.

The timed window holds only execution: every run is created (one `commands.create_run` each,
undispatched) before it, the window opens when the runs are handed to the pool — which claims
them, at most `concurrency` at a time, as the actor does — and closes when the pool goes idle
(an in-process signal, no polling).
"""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import json
import os
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from bench.common import new_workspace
from bench.counts import Probe
from stevora.engine import commands
from stevora.engine.inline import InlineDispatcher
from stevora.engine.run_pool import RunPool
from stevora.ids import new_id
from stevora.llm.messages import LlmRequest, LlmResponse, ToolCall, Usage
from stevora.llm.router import ProviderRouter
from stevora.llm.scripted_provider import ScriptedProvider, scripted_rounds, synthesize_value
from stevora.logging import configure_logging
from stevora.runtime import Runtime
from stevora.settings import Settings
from stevora.tasks import TaskRegistry
from stevora.tools import ToolRegistry
from tests.conftest import create_definition

CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
MAX_TOOL_ROUNDS = 20  # LlmStep.max_tool_rounds' upper bound


class TimedProvider(ScriptedProvider):
    """The scripted agent (`scripted:rounds=N`: one call of every offered tool per round for N
    rounds, then an answer), recording when each run's model calls start.

    A stand-in as cheap as it can be, so that the counts are Stevora's: it answers from the
    run's call count (O(1) per call) instead of `scripted_response`'s scan of the whole
    conversation, with the same answers' shape (tool-call ids, arguments from the prompt)."""

    def __init__(self) -> None:
        super().__init__(name="scripted", record_limit=0)
        self.calls: dict[str, list[float]] = defaultdict(list)
        # While a Probe counts: its call count at each model call, per run (calls per round index).
        self.probe: Probe | None = None
        self.call_counts: dict[str, list[int]] = defaultdict(list)
        self._rounds: dict[str, int] = {}
        self._arguments: dict[str, list[str]] = {}  # per run (its tag): each tool's arguments

    async def complete(self, request: LlmRequest) -> LlmResponse:
        first = request.messages[0]  # the prompt (the bench's definitions have no system prompt)
        tag = str(
            first.content
            if first.role == "user"
            else next(m.content for m in request.messages if m.role == "user")
        )
        if self.probe is not None and self.probe.active:
            self.call_counts[str(tag)].append(self.probe.total())
        stamps = self.calls[str(tag)]
        stamps.append(time.perf_counter())
        tools = request.tools
        rounds = self._rounds.get(request.model)
        if rounds is None:
            rounds = self._rounds[request.model] = scripted_rounds(request.model)
        if len(stamps) > rounds or not tools or request.tool_choice == "none":
            return LlmResponse(
                text=f"done after {len(stamps) - 1} rounds",
                tool_calls=[],
                usage=Usage(input_tokens=10 * len(stamps), output_tokens=5),
                model=request.model,
                finish_reason="stop",
                response_id=None,
                provider=self.name,
            )
        arguments = self._arguments.get(tag)
        if arguments is None:
            arguments = self._arguments[tag] = [
                json.dumps(synthesize_value(t.parameters, str(tag)), separators=(",", ":")) for t in tools
            ]
        prefix = "call_" if len(stamps) == 1 else f"call_r{len(stamps)}_"
        return LlmResponse(
            text=None,
            tool_calls=[
                ToolCall(f"{prefix}{i}", t.name, arguments[i - 1]) for i, t in enumerate(tools, start=1)
            ],
            usage=Usage(input_tokens=10 * len(stamps), output_tokens=5),
            model=request.model,
            finish_reason="tool_calls",
            response_id=None,
            provider=self.name,
        )


def quiet_json_logging(settings: Settings) -> None:
    """The worker's production logging (structlog JSON at INFO), written to /dev/null so that
    its cost is measured but the terminal stays readable."""
    devnull = open(os.devnull, "w")
    with contextlib.redirect_stderr(devnull):
        configure_logging(settings.model_copy(update={"log_format": "json"}))


def backend_cpu_s(pids: list[int]) -> float:
    """utime + stime of these processes, in seconds (from /proc/<pid>/stat)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15 of stat(5))
    return total / CLOCK_TICKS_PER_S


async def database_backend_pids(pool: asyncpg.Pool) -> list[int]:
    """PostgreSQL backends connected to this benchmark's database (all workers' pools)."""
    rows = await pool.fetch("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
    return [r["pid"] for r in rows]


@dataclass
class Level:
    """One timed execution of `runs` runs at `concurrency` runs in flight."""

    rounds: int
    concurrency: int
    runs: int
    wall_s: float
    worker_cpu_s: float
    db_cpu_s: float
    per_round_ms: list[float] = field(default_factory=list)
    by_index: dict[int, list[float]] = field(default_factory=dict)
    load: float = 0.0

    @property
    def total_rounds(self) -> int:
        return self.runs * self.rounds

    @property
    def rounds_per_s(self) -> float:
        return self.total_rounds / self.wall_s


class LoopBench:
    """A runtime with the scripted agent and a `noop` tool, and a definition per round count."""

    def __init__(self, rt: Runtime, provider: TimedProvider, dispatcher: InlineDispatcher, ws: str) -> None:
        self.rt = rt
        self.provider = provider
        self.dispatcher = dispatcher
        self.ws = ws
        self._definitions: dict[int, str] = {}
        self.create_s: list[float] = []  # wall time of each create_run, outside the timed window
        self.profiler: cProfile.Profile | None = None  # enabled inside timed windows only
        self.probe: Probe | None = None  # counts inside the window when set (bench/counts.py)

    @classmethod
    async def start(cls, url: str, *, hot_pool_size: int = 20, group_commit: bool = True) -> LoopBench:
        settings = Settings(
            database_url=url,
            hot_pool_size=hot_pool_size,
            lease_s=60,
            heartbeat_s=20,
            group_commit=group_commit,
        )
        quiet_json_logging(settings)
        provider = TimedProvider()
        tools = ToolRegistry()

        async def noop(input: dict[str, Any]) -> dict[str, bool]:
            return {"ok": True}

        tools.register(
            "noop",
            noop,
            description="does nothing",
            parameters={"type": "object", "properties": {"note": {"type": "string"}}},
        )
        dispatcher = InlineDispatcher()
        rt = await Runtime.start(
            settings,
            dispatcher=dispatcher,
            providers=ProviderRouter({"scripted": provider}),
            tasks=TaskRegistry(),
            tools=tools,
        )
        return cls(rt, provider, dispatcher, await new_workspace(rt.pool))

    async def close(self) -> None:
        await self.rt.close()

    async def definition(self, rounds: int) -> str:
        if rounds not in self._definitions:
            self._definitions[rounds] = def_id = await create_definition(
                self.rt,
                self.ws,
                {
                    "name": f"bench-loop-{rounds}",
                    "version": new_id("v"),
                    "steps": [
                        {
                            "type": "llm",
                            "name": "agent",
                            "model": f"scripted:rounds={rounds}",
                            "maxToolRounds": min(rounds, MAX_TOOL_ROUNDS),
                            "messages": [{"role": "user", "content": "{{input.tag}}"}],
                            "tools": ["noop"],
                        }
                    ],
                },
            )
            if rounds > MAX_TOOL_ROUNDS:
                # Bench only: a definition caps maxToolRounds at 20; longer runs (to show that a
                # round's cost does not grow with the round number) lift the cap in the worker's
                # cached copy of the parsed definition, which is what the driver reads.
                step = (await self.rt.definitions.get(def_id)).steps[0]
                object.__setattr__(step, "max_tool_rounds", rounds)
        return self._definitions[rounds]

    async def create_runs(self, rounds: int, n: int) -> list[str]:
        """`n` PENDING runs, not handed to any pool (the dispatcher has none attached)."""
        def_id = await self.definition(rounds)
        self.dispatcher.run_pool = None
        ids = []
        for i in range(n):
            t0 = time.perf_counter()
            row, _ = await commands.create_run(
                self.rt, self.ws, def_id, {"tag": f"{rounds}-{i}-{new_id('x')}"}
            )
            self.create_s.append(time.perf_counter() - t0)
            ids.append(row["id"])
        self.dispatcher.sent.clear()
        return ids

    async def execute(self, run_ids: list[str], concurrency: int) -> tuple[float, float, float]:
        """Hand the runs to a RunPool holding at most `concurrency` at once; wall, worker CPU and
        database CPU seconds until the pool is idle."""
        self.rt.settings = self.rt.settings.model_copy(update={"max_concurrent_runs": concurrency})
        pool = RunPool(self.rt)
        self.dispatcher.run_pool = pool
        pool.start()
        before = await database_backend_pids(self.rt.pool)
        try:
            cpu0, db0, t0 = time.process_time(), backend_cpu_s(before), time.perf_counter()
            if self.profiler is not None:
                self.profiler.enable()
            if self.probe is not None:
                self.probe.start()
            try:
                await asyncio.gather(*(pool.submit(r) for r in run_ids))
                await pool.wait_idle()
            finally:
                if self.probe is not None:
                    self.probe.stop()
            if self.profiler is not None:
                self.profiler.disable()
            wall = time.perf_counter() - t0
            cpu = time.process_time() - cpu0
            # Connections the pool opened inside the window count from zero.
            after = set(before) | set(await database_backend_pids(self.rt.pool))
            db = backend_cpu_s(sorted(after)) - db0
        finally:
            await pool.close()
            self.dispatcher.run_pool = None
        bad = await self.rt.pool.fetch(
            "SELECT id, status, error FROM workflow_runs WHERE id = ANY($1::text[]) AND status <> 'COMPLETED'",
            run_ids,
        )
        if bad:
            raise SystemExit(f"{len(bad)} runs did not complete, e.g. {dict(bad[0])}")
        return wall, cpu, db

    async def level(self, rounds: int, concurrency: int, runs: int) -> Level:
        run_ids = await self.create_runs(rounds, runs)
        self.provider.calls.clear()
        self.provider._arguments.clear()
        wall, cpu, db = await self.execute(run_ids, concurrency)
        level = Level(rounds, concurrency, runs, wall, cpu, db, load=os.getloadavg()[0])
        by_index: dict[int, list[float]] = defaultdict(list)
        for stamps in self.provider.calls.values():
            for k in range(1, len(stamps)):
                level.per_round_ms.append((stamps[k] - stamps[k - 1]) * 1000)
                by_index[k].append((stamps[k] - stamps[k - 1]) * 1000)
        level.by_index = dict(by_index)
        return level
