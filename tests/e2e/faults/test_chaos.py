"""The chaos suite: a real `stevora api`, two worker processes, a private PostgreSQL and a broker,
a mixed workload, and faults at random moments — then the invariants, checked with SQL and the API.

Workload: 3-round tool loops with two parallel calls per round (OpenAI and Anthropic wire formats,
priced), runs with an approval decided through the API, runs whose task fails twice before it
succeeds, agents whose tool calls the API caller answers (`POST /tool-outputs`) and agents whose
tool calls run as child workflow runs. Faults: SIGKILL of a random worker (replaced at once) at random moments, one broker
restart, one PostgreSQL restart, one termination of every backend; API requests (creates with
and without idempotency keys, gets, lists, events, an SSE stream) run throughout.

The CI form (default) is bounded to about a minute per broker; `STEVORA_CHAOS_FULL=1` runs the
full form (200 runs, 20 kills). Run alone: `pytest tests/e2e/faults -s` prints the figures.
See docs/testing.md.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from stevora.db.migrate import upgrade_head
from stevora.ids import new_id
from stevora.testing.fake_llm import (
    FakeLLMServer,
    FakeResponse,
    _neutral_request,
    anthropic_text,
    anthropic_tool_use,
    openai_text,
    openai_tool_calls,
)
from tests.e2e.conftest import require_broker
from tests.e2e.faults.services import FaultProxy, PrivatePostgres, PrivateRedis, free_port
from tests.e2e.test_cli_processes import _wait_healthy as wait_healthy
from tests.e2e.workerproc import WorkerProcess

ROOT = Path(__file__).resolve().parents[3]
FULL = os.environ.get("STEVORA_CHAOS_FULL") == "1"


@dataclass(frozen=True)
class Profile:
    agent_runs: int
    approval_runs: int
    flaky_runs: int
    client_runs: int  # agents whose tool calls the API caller answers (POST /tool-outputs)
    workflow_runs: int  # agents whose tool calls run as child workflow runs
    kills: int
    create_window_s: float  # runs are created over this long, while the faults happen
    chaos_s: float  # faults keep coming at least this long
    drain_timeout_s: float


PROFILE = (
    Profile(
        agent_runs=120,
        approval_runs=25,
        flaky_runs=25,
        client_runs=15,
        workflow_runs=15,
        kills=20,
        create_window_s=40,
        chaos_s=60,
        drain_timeout_s=240,
    )
    if FULL
    else Profile(
        agent_runs=20,
        approval_runs=6,
        flaky_runs=6,
        client_runs=4,
        workflow_runs=4,
        kills=10,
        create_window_s=14,
        chaos_s=26,
        drain_timeout_s=120,
    )
)
TOOL_ROUNDS = 3
CALLS_PER_ROUND = 2
PRICES = {"gpt-4o-mini": (150.0, 600.0), "claude-haiku-4-5": (100.0, 500.0)}  # USD per million tokens
DEAD_CONNECTION = (
    "connection is closed",
    "ConnectionDoesNotExistError",
    "AdminShutdownError",
    "CannotConnectNowError",
)
# 5xx seen this long after an outage ended still belong to it (pools reconnecting).
OUTAGE_GRACE_S = 3.0


def chaos_responder(kind: str) -> Any:
    """The model: TOOL_ROUNDS rounds of CALLS_PER_ROUND parallel `chaos_effect` calls, then an answer."""

    def respond(body: dict[str, Any]) -> FakeResponse:
        request = _neutral_request(kind, body)  # type: ignore[arg-type]
        done = sum(1 for m in request.messages if m.role == "assistant" and m.tool_calls)
        delay = random.uniform(0.02, 0.25)
        tokens_in, tokens_out = 200 + 50 * done, 40
        if done < TOOL_ROUNDS:
            calls = [
                (f"call_r{done + 1}_{i}", "chaos_effect", json.dumps({"item": f"r{done + 1}-{i}"}))
                for i in range(CALLS_PER_ROUND)
            ]
            if kind == "openai":
                usage = {"prompt_tokens": tokens_in, "completion_tokens": tokens_out}
                return openai_tool_calls(calls, model=request.model, usage=usage, delay_s=delay)
            uses = [(cid, name, json.loads(args)) for cid, name, args in calls]
            usage = {"input_tokens": tokens_in, "output_tokens": tokens_out}
            return anthropic_tool_use(uses, model=request.model, usage=usage, delay_s=delay)
        if kind == "openai":
            usage = {"prompt_tokens": tokens_in, "completion_tokens": tokens_out}
            return openai_text("All done.", model=request.model, usage=usage, delay_s=delay)
        usage = {"input_tokens": tokens_in, "output_tokens": tokens_out}
        return anthropic_text("All done.", model=request.model, usage=usage, delay_s=delay)

    return respond


def agent_step(model: str) -> dict[str, Any]:
    return {
        "type": "llm",
        "name": "agent",
        "model": model,
        "messages": [{"role": "user", "content": "Do the chores for {{input.n}}"}],
        "tools": [{"name": "chaos_effect"}],
        "parallelToolCalls": True,
        "maxToolRounds": TOOL_ROUNDS + 2,
        "retry": {"maxAttempts": 5, "backoffMs": 200},
    }


CLIENT_EFFECT = {
    "name": "chaos_effect",
    "description": "Done by the caller's application",
    "parameters": {"type": "object", "properties": {"item": {"type": "string"}}},
    "execution": "client",
}


def agent_with(model: str, tool: dict[str, Any]) -> dict[str, Any]:
    return {**agent_step(model), "tools": [tool]}


WORKFLOWS: dict[str, list[dict[str, Any]]] = {
    # A child first: the workflow-tool agent below names it, and it must exist when that is created.
    "chaos-child": [{"type": "task", "name": "chore", "handler": "chaos_prepare"}],
    "client-agent": [agent_with("gpt-4o-mini", CLIENT_EFFECT)],
    "workflow-agent": [agent_with("claude-haiku-4-5", {"name": "chaos_effect", "workflow": "chaos-child"})],
    "agent-openai": [agent_step("gpt-4o-mini")],
    "agent-anthropic": [agent_step("claude-haiku-4-5")],
    "approval": [
        {"type": "task", "name": "prepare", "handler": "chaos_prepare"},
        {"type": "approval", "name": "review", "contentKey": "draft", "prompt": "Ship it?"},
        {"type": "task", "name": "after", "handler": "chaos_prepare"},
    ],
    "flaky": [
        {
            "type": "task",
            "name": "flaky",
            "handler": "chaos_flaky",
            "retry": {"maxAttempts": 3, "backoffMs": 100},
        }
    ],
}


@dataclass
class Figures:
    broker: str
    runs: int = 0
    kills: int = 0
    restarts: Counter[str] = field(default_factory=Counter)
    api_codes: Counter[str] = field(default_factory=Counter)
    api_5xx_in_outage: Counter[int] = field(default_factory=Counter)
    api_5xx_outside: list[tuple[float, str, int]] = field(default_factory=list)
    api_500_dead_connection: int = 0
    creates_unknown: int = 0
    tool_reexecutions: int = 0
    violations: list[str] = field(default_factory=list)
    outages: list[list[float]] = field(default_factory=list)  # [start, end]; end is inf while it lasts

    def in_outage(self, at: float) -> bool:
        return any(start <= at <= end + OUTAGE_GRACE_S for start, end in self.outages)

    def report(self) -> str:
        return (
            f"\nchaos[{self.broker}] runs={self.runs} kills={self.kills} restarts={dict(self.restarts)} "
            f"violations={len(self.violations)} tool_reexecutions={self.tool_reexecutions} "
            f"creates_with_unknown_outcome={self.creates_unknown}\n"
            f"  api responses by code: {dict(sorted(self.api_codes.items()))}\n"
            f"  api 5xx while PostgreSQL was down or reconnecting: {dict(self.api_5xx_in_outage)} "
            "(only 503 is allowed)\n"
            f"  api 5xx outside outages: {len(self.api_5xx_outside)}, of which on a connection the database had "
            f"dropped: {self.api_500_dead_connection}\n"
            + "".join(f"  VIOLATION: {v}\n" for v in self.violations[:40])
        )


class Stack:
    """API process + worker processes + fake LLM server on a private PostgreSQL and broker."""

    def __init__(self, broker: str, tmp: Path) -> None:
        self.broker = broker
        self.tmp = tmp
        self.pg = PrivatePostgres()
        self.redis: PrivateRedis | None = None
        self.proxy: FaultProxy | None = None
        self.fake = FakeLLMServer(require_auth=True)
        self.fake.openai.responder = chaos_responder("openai")
        self.fake.anthropic.responder = chaos_responder("anthropic")
        self.queue = f"chaos-{new_id('q')[2:]}"
        self.workers: list[WorkerProcess] = []
        self.api: subprocess.Popen[bytes] | None = None
        self.api_port = free_port()
        self.broker_url = ""

    @property
    def db_url(self) -> str:
        return self.pg.url

    def _env(self) -> dict[str, str]:
        return {
            "OPENAI_API_KEY": "test",
            "OPENAI_BASE_URL": self.fake.openai_base_url,
            "ANTHROPIC_API_KEY": "test",
            "ANTHROPIC_BASE_URL": self.fake.anthropic_base_url,
            "STEVORA_MODEL_PRICES": json.dumps(PRICES),
            "STEVORA_PROVIDER_MAX_RETRIES": "2",
            "STEVORA_TOOL_MODULES": json.dumps(["tests.e2e.faults.chaos_tools"]),
            "STEVORA_RATE_LIMIT_PER_MINUTE": "0",
        }

    async def start(self) -> None:
        self.pg.start()
        await asyncio.to_thread(upgrade_head, self.db_url)
        conn = await asyncpg.connect(self.db_url.replace("+asyncpg", ""))
        # One row per real execution (its own id, so a counting insert retried through an outage
        # is not a second execution); the view gives executions per idempotency key.
        await conn.execute(
            "CREATE TABLE chaos_executions (execution_id text PRIMARY KEY, idempotency_key text NOT NULL, "
            "kind text NOT NULL, pid int, at timestamptz NOT NULL DEFAULT clock_timestamp());"
            "CREATE VIEW chaos_effects AS SELECT idempotency_key, min(kind) AS kind, count(*)::int AS executions "
            "FROM chaos_executions GROUP BY idempotency_key"
        )
        await conn.close()
        if self.broker == "redis":
            self.redis = PrivateRedis()
            self.redis.start()
            self.broker_url = self.redis.url
        else:
            require_broker("rabbitmq")
            self.proxy = FaultProxy(5672)
            self.proxy.start()
            self.broker_url = f"amqp://guest:guest@127.0.0.1:{self.proxy.port}/"
        self._spawn_api()
        for _ in range(2):
            self.start_worker()
        await self.wait_healthy()

    def _spawn_api(self) -> None:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("STEVORA_", "OPENAI_", "ANTHROPIC_", "ADMIN_"))
        }
        env.update(
            self._env(),
            PYTHONPATH=str(ROOT),
            STEVORA_DATABASE_URL=self.db_url,
            STEVORA_BROKER_URL=self.broker_url,
            STEVORA_QUEUE_NAME=self.queue,
            STEVORA_LOG_FORMAT="json",
            STEVORA_LOG_LEVEL="WARNING",
        )
        self.api_log = self.tmp / "api.log"
        with self.api_log.open("wb") as out:
            self.api = subprocess.Popen(
                [sys.executable, "-m", "stevora.cli", "api", "--port", str(self.api_port)],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def start_worker(self) -> WorkerProcess:
        worker = WorkerProcess(self.db_url, self.broker_url, self.queue, extra_env=self._env())
        self.workers.append(worker)
        return worker

    @property
    def live_workers(self) -> list[WorkerProcess]:
        return [w for w in self.workers if w.proc.poll() is None]

    async def wait_healthy(self) -> None:
        assert self.api is not None
        await wait_healthy(f"http://127.0.0.1:{self.api_port}", self.api, self.api_log)

    def restart_broker(self) -> None:
        if self.redis is not None:
            self.redis.restart()
        elif self.proxy is not None:
            self.proxy.restart()

    def close(self) -> None:
        for worker in self.workers:
            worker.stop()
        if self.api is not None and self.api.poll() is None:
            self.api.terminate()
            try:
                self.api.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.api.kill()
        if self.redis is not None:
            self.redis.stop()
        if self.proxy is not None:
            self.proxy.stop()
        self.fake.close()
        self.pg.stop()


@pytest.fixture(params=["rabbitmq", "redis"])
async def stack(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Stack]:
    s = Stack(request.param, tmp_path)
    try:
        await s.start()
        yield s
    finally:
        s.close()


class Api:
    """An HTTP client that records every answer's status code and when it came."""

    def __init__(self, stack: Stack, figures: Figures) -> None:
        self.client = httpx.AsyncClient(base_url=f"http://127.0.0.1:{stack.api_port}", timeout=15)
        self.figures = figures
        self.headers: dict[str, str] = {}

    async def call(self, method: str, url: str, **kwargs: Any) -> httpx.Response | None:
        at = time.monotonic()
        try:
            response = await self.client.request(method, url, headers=self.headers, **kwargs)
        except httpx.TransportError as exc:
            self.figures.api_codes[type(exc).__name__] += 1
            return None
        code = response.status_code
        self.figures.api_codes[str(code)] += 1
        if code >= 500:
            if self.figures.in_outage(at) or self.figures.in_outage(time.monotonic()):
                self.figures.api_5xx_in_outage[code] += 1
            else:
                self.figures.api_5xx_outside.append((at, f"{method} {url}", code))
        return response

    async def bootstrap(self, definitions: dict[str, list[dict[str, Any]]]) -> dict[str, str]:
        slug = new_id("chaos").replace("_", "-")
        ws = await self.call("POST", "/v1/workspaces", json={"name": "Chaos", "slug": slug})
        assert ws is not None and ws.status_code == 201, ws.text if ws else None
        key = await self.call(
            "POST", "/v1/api-keys", json={"name": "chaos", "workspaceId": ws.json()["data"]["id"]}
        )
        assert key is not None and key.status_code == 201, key.text if key else None
        self.headers = {"x-api-key": key.json()["data"]["key"]}
        ids = {}
        for name, steps in definitions.items():
            body = {"name": name, "version": "1", "steps": steps}
            response = await self.call("POST", "/v1/workflow-definitions", json=body)
            assert response is not None and response.status_code == 201, response.text if response else None
            ids[name] = response.json()["data"]["id"]
        return ids


async def create_runs(api: Api, definition_ids: dict[str, str], profile: Profile, created: list[str]) -> None:
    kinds = (
        ["agent-openai", "agent-anthropic"] * (profile.agent_runs // 2)
        + ["approval"] * profile.approval_runs
        + ["flaky"] * profile.flaky_runs
        + ["client-agent"] * profile.client_runs
        + ["workflow-agent"] * profile.workflow_runs
    )
    random.shuffle(kinds)
    pause = profile.create_window_s / max(1, len(kinds))
    for n, kind in enumerate(kinds):
        body: dict[str, Any] = {"definitionId": definition_ids[kind], "input": {"n": n}}
        if n % 2 == 0:  # half with an idempotency key: those are retried until answered
            body["idempotencyKey"] = f"chaos-{n}"
            for _ in range(120):
                response = await api.call("POST", "/v1/workflow-runs", json=body)
                if response is not None and response.status_code in (200, 201):
                    created.append(response.json()["data"]["id"])
                    break
                await asyncio.sleep(0.5)
        else:  # without a key a client must not retry blindly: an unanswered create is "unknown"
            response = await api.call("POST", "/v1/workflow-runs", json=body)
            if response is not None and response.status_code == 201:
                created.append(response.json()["data"]["id"])
            else:
                api.figures.creates_unknown += 1
        await asyncio.sleep(pause)


async def approve_forever(api: Api) -> None:
    while True:
        response = await api.call("GET", "/v1/approval-requests", params={"pending": "true"})
        if response is not None and response.status_code == 200:
            for approval in response.json()["data"]:
                await api.call(
                    "POST",
                    f"/v1/approval-requests/{approval['id']}/decide",
                    json={"decision": "approved", "decidedBy": "chaos"},
                )
        await asyncio.sleep(0.3)


async def answer_tool_outputs_forever(api: Api) -> None:
    """The API caller of client-executed tools: answers every pending call, as an app would."""
    while True:
        response = await api.call("GET", "/v1/workflow-runs", params={"status": "WAITING", "pageSize": 100})
        if response is not None and response.status_code == 200:
            for run in response.json()["data"]:
                action = run.get("requiredAction")
                if not action:
                    continue
                outputs = [
                    {"toolCallId": c["id"], "output": {"ok": True, "args": c["arguments"]}}
                    for c in action["toolCalls"]
                ]
                await api.call(
                    "POST", f"/v1/workflow-runs/{run['id']}/tool-outputs", json={"toolOutputs": outputs}
                )
        await asyncio.sleep(0.3)


async def read_forever(api: Api, created: list[str]) -> None:
    while True:
        await api.call("GET", "/v1/workflow-runs", params={"limit": 20})
        if created:
            run_id = random.choice(created)
            await api.call("GET", f"/v1/workflow-runs/{run_id}")
            await api.call("GET", f"/v1/workflow-runs/{run_id}/events")
            if random.random() < 0.1:
                await read_stream(api, run_id)
        await asyncio.sleep(0.1)


async def read_stream(api: Api, run_id: str) -> None:
    at = time.monotonic()
    try:
        async with api.client.stream(
            "GET", f"/v1/workflow-runs/{run_id}/events/stream", headers=api.headers, timeout=5
        ) as response:
            api.figures.api_codes[f"{response.status_code} (sse)"] += 1
            if response.status_code >= 500 and not api.figures.in_outage(at):
                api.figures.api_5xx_outside.append((at, "SSE", response.status_code))
            async for line in response.aiter_lines():
                if line.startswith("event: WORKFLOW_") and "STARTED" not in line:
                    break
                if time.monotonic() - at > 2:
                    break
    except (httpx.TransportError, httpx.StreamError):
        api.figures.api_codes["sse_transport_error"] += 1


async def report_progress(stack: Stack, figures: Figures) -> None:
    db_url = stack.db_url.replace("+asyncpg", "")
    while True:
        await asyncio.sleep(10)
        try:
            db = await asyncpg.connect(db_url)
            rows = await db.fetch("SELECT status, count(*) FROM workflow_runs GROUP BY status")
            await db.close()
            print(
                f"chaos[{stack.broker}] kills={figures.kills} {dict((r[0], r[1]) for r in rows)}", flush=True
            )
        except Exception as exc:  # the database may be restarting
            print(f"chaos[{stack.broker}] progress unavailable: {exc!r}", flush=True)


def _timeline(stack: Stack, what: str) -> None:
    """The faults with wall-clock times, to read beside a violation's executions (pid@time)."""
    print(f"chaos[{stack.broker}] {datetime.now(UTC):%H:%M:%S.%f} {what}", flush=True)


async def inject_faults(stack: Stack, figures: Figures, profile: Profile) -> None:
    started = time.monotonic()
    schedule = {"broker": 0.25, "postgres": 0.5, "terminate": 0.75}
    while figures.kills < profile.kills or time.monotonic() - started < profile.chaos_s:
        await asyncio.sleep(random.uniform(0.6, 2.2))
        elapsed = (time.monotonic() - started) / profile.chaos_s
        for fault, when in list(schedule.items()):
            if elapsed < when:
                continue
            del schedule[fault]
            if fault == "broker":
                await asyncio.to_thread(stack.restart_broker)
            else:
                outage = [time.monotonic(), math.inf]
                figures.outages.append(outage)
                if fault == "postgres":
                    await asyncio.to_thread(stack.pg.restart)
                else:
                    await stack.pg.terminate_backends()
                outage[1] = time.monotonic()
            figures.restarts[fault] += 1
            _timeline(stack, f"{fault} done")
        live = stack.live_workers
        if live and figures.kills < profile.kills:
            victim = random.choice(live)
            victim.kill()
            figures.kills += 1
            _timeline(stack, f"killed worker pid {victim.proc.pid}")
            stack.start_worker()
            # Keep two workers most of the time, but let the kills land at random moments.


async def wait_until_finished(db: asyncpg.Connection, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        open_runs = await db.fetchval(
            "SELECT count(*) FROM workflow_runs WHERE status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED')"
        )
        if open_runs == 0:
            return
        await asyncio.sleep(0.5)


INVARIANTS: dict[str, str] = {
    "run not COMPLETED": "SELECT id || ' ' || status || ' ' || coalesce(error::text, '') FROM workflow_runs "
    "WHERE status <> 'COMPLETED'",
    "duplicate trace for a tool call": "SELECT llm_call_id || ':' || sequence FROM tool_trace "
    "GROUP BY llm_call_id, sequence HAVING count(*) > 1 "
    "UNION ALL SELECT idempotency_key FROM tool_trace GROUP BY idempotency_key HAVING count(*) > 1",
    "duplicate completed model call for a round": "SELECT step_run_id || ':' || round FROM llm_calls "
    "WHERE status = 'completed' GROUP BY step_run_id, round HAVING count(*) > 1",
    "tool event without its trace": "SELECT e.id FROM workflow_events e "
    "WHERE e.event_type IN ('TOOL_CALL_COMPLETED', 'TOOL_CALL_FAILED') "
    "AND NOT EXISTS (SELECT 1 FROM tool_trace t WHERE t.id = e.payload->>'toolTraceId')",
    "trace without exactly one event": "SELECT t.id FROM tool_trace t WHERE (SELECT count(*) FROM workflow_events e "
    "WHERE e.workflow_run_id = t.workflow_run_id AND e.event_type IN ('TOOL_CALL_COMPLETED', 'TOOL_CALL_FAILED') "
    "AND e.payload->>'toolTraceId' = t.id) <> 1",
    "event sequence with a gap": "SELECT r.id FROM workflow_runs r JOIN workflow_events e ON e.workflow_run_id = r.id "
    "GROUP BY r.id, r.event_seq HAVING min(e.sequence) <> 1 OR max(e.sequence) <> count(*) "
    "OR count(DISTINCT e.sequence) <> count(*) OR max(e.sequence) <> r.event_seq",
    # Which worker processes ran it, and when: to be read beside the kills and outages.
    "side effect executed more than twice": "SELECT e.idempotency_key || ' x' || e.executions || ' ' || "
    "(SELECT string_agg(x.pid || '@' || to_char(x.at, 'HH24:MI:SS.MS'), ', ' ORDER BY x.at) "
    "FROM chaos_executions x WHERE x.idempotency_key = e.idempotency_key) FROM chaos_effects e "
    "WHERE e.executions > 2",
    "completed tool call without its side effect": "SELECT t.idempotency_key FROM tool_trace t "
    "WHERE t.status = 'completed' AND NOT EXISTS (SELECT 1 FROM chaos_effects c WHERE c.idempotency_key = t.idempotency_key) "
    # calls answered from outside the loop (the API caller, a child run) ran no handler here
    "AND NOT EXISTS (SELECT 1 FROM awaited_tool_calls a WHERE a.llm_call_id = t.llm_call_id AND a.sequence = t.sequence)",
    "client or workflow agent without all its answers": "SELECT r.id FROM workflow_runs r JOIN workflow_definitions d "
    "ON d.id = r.definition_id WHERE d.name IN ('client-agent', 'workflow-agent') AND (SELECT count(*) FROM tool_trace t "
    f"WHERE t.workflow_run_id = r.id AND t.status = 'completed') <> {TOOL_ROUNDS * CALLS_PER_ROUND}",
    "workflow call without exactly one completed child": "SELECT a.id FROM awaited_tool_calls a WHERE a.kind = 'workflow' "
    "AND (SELECT count(*) FROM workflow_runs c WHERE c.parent_run_id = a.workflow_run_id "
    "AND c.parent_tool_call_id = a.tool_call_id AND c.status = 'COMPLETED') <> 1",
    "totalCostCents differs from its LLM calls": "SELECT r.id || ' ' || r.total_cost_cents || ' vs ' || "
    "coalesce(sum(c.cost_usd), 0) * 100 FROM workflow_runs r LEFT JOIN llm_calls c ON c.workflow_run_id = r.id "
    "GROUP BY r.id HAVING abs(r.total_cost_cents - coalesce(sum(c.cost_usd), 0) * 100) > 1e-6",
    "agent run without its rounds": "SELECT r.id FROM workflow_runs r JOIN workflow_definitions d ON d.id = r.definition_id "
    "WHERE d.name LIKE 'agent-%' AND ((SELECT count(*) FROM tool_trace t WHERE t.workflow_run_id = r.id "
    f"AND t.status = 'completed') <> {TOOL_ROUNDS * CALLS_PER_ROUND} OR r.total_cost_cents <= 0)",
    "flaky run without three attempts": "SELECT r.id FROM workflow_runs r JOIN workflow_definitions d "
    "ON d.id = r.definition_id WHERE d.name = 'flaky' AND (r.state->>'flaky') IS DISTINCT FROM '3'",
}


async def check_invariants(stack: Stack, api: Api, figures: Figures, created: list[str]) -> None:
    db = await asyncpg.connect(stack.db_url.replace("+asyncpg", ""))
    try:
        await wait_until_finished(db, PROFILE.drain_timeout_s)
        figures.runs = int(await db.fetchval("SELECT count(*) FROM workflow_runs"))
        for name, sql in INVARIANTS.items():
            for row in await db.fetch(sql):
                figures.violations.append(f"{name}: {row[0]}")
        figures.tool_reexecutions = int(
            await db.fetchval("SELECT count(*) FROM chaos_effects WHERE kind = 'tool' AND executions = 2")
        )
        missing = set(created) - {r["id"] for r in await db.fetch("SELECT id FROM workflow_runs")}
        figures.violations += [f"run answered as created but not stored: {m}" for m in missing]
        # The API tells the same story: status and cost as stored.
        for run_id in random.sample(created, min(len(created), 15)):
            response = await api.call("GET", f"/v1/workflow-runs/{run_id}")
            row = await db.fetchrow(
                "SELECT status, total_cost_cents FROM workflow_runs WHERE id = $1", run_id
            )
            if response is None or response.status_code != 200:
                figures.violations.append(
                    f"GET run {run_id} answered {response.status_code if response else None}"
                )
                continue
            data = response.json()["data"]
            if (
                data["status"] != row["status"]
                or abs(data["totalCostCents"] - row["total_cost_cents"]) > 1e-6
            ):
                figures.violations.append(f"API disagrees with the database on {run_id}: {data['status']}")
    finally:
        await db.close()
    figures.violations += [
        f"API {code} outside a PostgreSQL outage: {what}" for _, what, code in figures.api_5xx_outside
    ]
    figures.violations += [
        f"API answered {code} (not 503) {count}x while PostgreSQL was down"
        for code, count in figures.api_5xx_in_outage.items()
        if code != 503
    ]


@pytest.mark.timeout(900 if FULL else 300)
async def test_no_run_lost_or_duplicated_under_kills_and_restarts(stack: Stack) -> None:
    figures = Figures(stack.broker)
    api = Api(stack, figures)
    definition_ids = await api.bootstrap(WORKFLOWS)
    created: list[str] = []
    background = [
        asyncio.create_task(approve_forever(api)),
        asyncio.create_task(answer_tool_outputs_forever(api)),
        asyncio.create_task(read_forever(api, created)),
    ]
    background.append(asyncio.create_task(report_progress(stack, figures)))
    try:
        await asyncio.gather(
            create_runs(api, definition_ids, PROFILE, created),
            inject_faults(stack, figures, PROFILE),
        )
        background.pop(2).cancel()  # stop reading; keep answering (and reporting) while the runs drain
        await check_invariants(stack, api, figures, created)
    finally:
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        await api.client.aclose()
    print(figures.report())
    assert figures.kills >= PROFILE.kills
    assert figures.restarts == Counter({"broker": 1, "postgres": 1, "terminate": 1})
    assert figures.runs >= len(created) > 0
    assert not figures.violations, figures.report()


def test_profile_is_bounded_in_ci() -> None:
    if not FULL:
        assert PROFILE.agent_runs + PROFILE.approval_runs + PROFILE.flaky_runs <= 60
        assert PROFILE.kills >= 10
