"""The hostile-model suite (issue 18): a fake model emits adversarial turns; nothing it says may
make Stevora run what the step did not offer, skip an approval, lose or double a trace, overrun a
budget, break the API or crash the worker.

Each hypothesis example is one run of a one-step agent workflow against the real engine
(in-process run pool, real claims and leases), PostgreSQL, the HTTP API (httpx ASGI) and the real
OpenAI/Anthropic SDKs talking to `FakeLLMServer`, which plays a generated script (`scripts.py`).
The step offers `get_order`, `add_numbers` and the approval-gated `issue_refund` with
`globalTools: false`; the worker also registers `delete_account`, the global `current_time` and
the gated `wire_money`. It also offers the tools of an MCP server of our own that answers like a
hostile one (`tests/mcp_servers/hostile.py`, over stdio, as the worker's server `h`): with `wipe`
excluded and `refund` approval-gated, results huge, deeply nested, carrying NUL and lone
surrogates or broken base64, and `die`, which kills the server mid-call (the next call restarts
it). Every handler writes to a side-effect log, and the MCP server logs every call it executes.
Approval requests are decided through the API as the script says (approved, rejected or edited).

Invariants after every run:
* nothing unoffered ran (the side-effect log and the MCP server's log hold offered tools only);
* no gated call ran unapproved (each `issue_refund` execution has its approval, approved or
  edited by us, for that very call; an edit's arguments are what ran);
* every call of every committed round is traced exactly once (completed, or failed with an error
  code), except the calls of the round past `maxToolRounds`, which the run refuses as a whole
  with `MAX_TOOL_ROUNDS`; every execution has one trace and ran once;
* the run ended (COMPLETED, or FAILED with an error code) within its budget: at most
  `maxToolRounds + 1` completed model calls, one failed call per step attempt, the run's
  `maxModelCalls` / `maxToolCalls` when the script gives it a budget (the calls of a round past
  `maxToolCalls` are not run: BUDGET_EXCEEDED), and `RUN_BUDGET_S` of wall time;
* the API and the UI read the run, its steps, events, LLM calls, tool traces and cost, and the
  run list, without an error, and agree with the database;
* the worker never crashed (no `run_driver_crashed`, no error logged).

CI form (default): `CI_EXAMPLES` derandomized examples, about a minute on 2 cores.
`STEVORA_HOSTILE_FULL=1`: `FULL_EXAMPLES` random ones (`STEVORA_HOSTILE_EXAMPLES=N` to choose).
The figures are printed at the end of the session (conftest.py; docs/testing.md).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog
from hypothesis import HealthCheck, Phase, given, note, settings

from stevora.api import create_app
from stevora.engine import mcp_servers
from stevora.mcp.config import McpServerConfig
from stevora.mcp.manager import McpClientManager
from stevora.testing.fake_llm import FakeLLMServer, anthropic_text, openai_text
from stevora.tools import ToolContext
from stevora.ui.auth import COOKIE_NAME
from tests.conftest import Harness
from tests.e2e.hostile.scripts import (
    GATED,
    MCP_GATED,
    MCP_OFFERED,
    MCP_SERVER,
    MCP_UNOFFERED,
    MODEL,
    OFFERED,
    UNOFFERED,
    Script,
    mcp_turns,
    scripts,
)
from tests.e2e.hostile.stats import STATS
from tests.integration.api.api_helpers import Tenant, bootstrap_tenant, make_client
from tests.integration.loop.conftest import SdkProviders, llm_step
from tests.mcp_servers import ROOT, logged_calls

# A failing example's repr (the fixtures) can be large; the note() names the script instead.
pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr")

FULL = os.environ.get("STEVORA_HOSTILE_FULL") == "1"
CI_EXAMPLES = 30
FULL_EXAMPLES = int(os.environ.get("STEVORA_HOSTILE_EXAMPLES", "200"))
RUN_BUDGET_S = 60.0
STEP_ATTEMPTS = 3
EDITED = {"order_id": "o_edited", "amount": 1}
EVERY_OFFERED = frozenset(OFFERED) | frozenset(MCP_OFFERED)
EVERY_GATED = frozenset({GATED, MCP_GATED})
MCP_TOOLS = {"mcp": MCP_SERVER, "exclude": ["wipe"], "approve": ["refund"]}


@dataclass
class Effect:
    name: str
    key: str
    args: dict[str, Any]


@dataclass(repr=False)
class HostileEnv:
    harness: Harness
    fake: FakeLLMServer
    client: httpx.AsyncClient
    tenant: Tenant
    mcp_log: Path
    effects: list[Effect] = field(default_factory=list)
    definitions: dict[tuple[str, int], str] = field(default_factory=dict)


def _register_tools(harness: Harness, effects: list[Effect]) -> None:
    tools = harness.tools

    @tools.tool
    async def get_order(order_id: str, ctx: ToolContext) -> dict[str, Any]:
        """Look up an order."""
        effects.append(Effect("get_order", ctx.idempotency_key, {"order_id": order_id}))
        return {"id": order_id, "total": 40}

    @tools.tool
    async def add_numbers(a: int, b: int, ctx: ToolContext) -> int:
        """Add two numbers."""
        effects.append(Effect("add_numbers", ctx.idempotency_key, {"a": a, "b": b}))
        return a + b

    @tools.tool(requires_approval=True)
    async def issue_refund(order_id: str, amount: int, ctx: ToolContext) -> str:
        """Refund an order (a person approves each refund)."""
        effects.append(Effect("issue_refund", ctx.idempotency_key, {"order_id": order_id, "amount": amount}))
        return "refunded"

    @tools.tool
    async def delete_account(user_id: str, ctx: ToolContext) -> str:
        """Registered in the worker, never offered by the step."""
        effects.append(Effect("delete_account", ctx.idempotency_key, {"user_id": user_id}))
        return "deleted"

    @tools.tool(global_=True)
    async def current_time(ctx: ToolContext) -> str:
        """A global tool; the step opts out of global tools."""
        effects.append(Effect("current_time", ctx.idempotency_key, {}))
        return "12:00"

    @tools.tool(requires_approval=True)
    async def wire_money(amount: int, ctx: ToolContext) -> str:
        """Approval-gated, registered, never offered."""
        effects.append(Effect("wire_money", ctx.idempotency_key, {"amount": amount}))
        return "wired"


@pytest.fixture(scope="session")
def hostile_fake() -> AsyncIterator[FakeLLMServer]:
    with FakeLLMServer() as server:
        yield server


@pytest.fixture
async def env(
    harness: Harness, hostile_fake: FakeLLMServer, settings: Any, tmp_path: Path
) -> AsyncIterator[HostileEnv]:
    """One engine, API, tenant, tool registry and MCP server for all the examples of the test."""
    assert set(OFFERED).isdisjoint(UNOFFERED) and set(MCP_OFFERED).isdisjoint(MCP_UNOFFERED)
    mcp_log = tmp_path / "mcp-calls.jsonl"
    server = McpServerConfig(
        name=MCP_SERVER, command=sys.executable, args=("-m", "tests.mcp_servers.hostile"),
        env={"MCP_CALL_LOG": str(mcp_log), "PYTHONPATH": str(ROOT)}, cwd=str(ROOT), timeoutMs=20_000,
    )  # fmt: skip
    harness.rt.mcp = McpClientManager({MCP_SERVER: server})
    await mcp_servers.publish(harness.rt, "hostile-suite")  # so the API accepts the step naming it
    app = create_app(settings, runtime=harness.rt)
    try:
        async with make_client(app) as client:
            tenant = await bootstrap_tenant(client)
            client.cookies.set(COOKIE_NAME, tenant.key, path="/ui")
            hostile = HostileEnv(harness, hostile_fake, client, tenant, mcp_log)
            _register_tools(harness, hostile.effects)
            yield hostile
    finally:
        hostile_fake.reset()
        await harness.rt.mcp.close()


async def _definition(env: HostileEnv, script: Script) -> str:
    key = (script.wire, script.max_tool_rounds)
    if key not in env.definitions:
        step = llm_step(
            model=MODEL[script.wire],
            tools=[*OFFERED, MCP_TOOLS],
            globalTools=False,
            maxToolRounds=script.max_tool_rounds,
            retry={"maxAttempts": STEP_ATTEMPTS, "backoffMs": 100, "backoffMultiplier": 1},
        )
        body = {"name": f"hostile-{script.wire}-{script.max_tool_rounds}", "version": "1", "steps": [step]}
        response = await env.client.post("/v1/workflow-definitions", json=body, headers=env.tenant.headers)
        assert response.status_code == 201, response.text
        env.definitions[key] = response.json()["data"]["id"]
    return env.definitions[key]


@dataclass
class Played:
    run_id: str
    seconds: float
    ended: bool
    decisions: dict[str, str]  # approval request id -> our decision
    violations: list[str]


async def _play(env: HostileEnv, script: Script) -> Played:
    """Enqueue the script, create the run through the API, decide its approvals, wait for its end."""
    fake, pool = env.fake, env.harness.rt.pool
    final = openai_text("Done.") if script.wire == "openai" else anthropic_text("Done.")
    fake.enqueue(*(turn.render(script.wire) for turn in script.turns))
    fake.responder = lambda _body: final  # once the script is spent, the model answers
    definition_id = await _definition(env, script)
    started = time.monotonic()
    response = await env.client.post(
        "/v1/workflow-runs",
        json={
            "definitionId": definition_id,
            "input": {"question": "Refund order o_1?"},
            **({"budget": script.budget} if script.budget is not None else {}),
        },
        headers=env.tenant.headers,
    )
    assert response.status_code == 201, response.text
    run_id = response.json()["data"]["id"]
    decisions: dict[str, str] = {}
    violations: list[str] = []
    choices = itertools.cycle(script.decisions)
    while True:
        status = await pool.fetchval("SELECT status FROM workflow_runs WHERE id = $1", run_id)
        if status in ("COMPLETED", "FAILED", "CANCELLED"):
            break
        if status == "WAITING":
            pending = await pool.fetch(
                "SELECT id FROM approval_requests WHERE workflow_run_id = $1 AND status = 'PENDING' "
                "ORDER BY created_at, id",
                run_id,
            )
            for row in pending:
                decision = next(choices)
                body: dict[str, Any] = {"decision": decision, "decidedBy": "hostile-suite"}
                if decision == "edited":
                    body["editedContent"] = EDITED
                answer = await env.client.post(
                    f"/v1/approval-requests/{row['id']}/decide", json=body, headers=env.tenant.headers
                )
                if answer.status_code != 200:
                    violations.append(
                        f"deciding {row['id']} ({decision}) answered {answer.status_code}: {answer.text[:300]}"
                    )
                decisions[row["id"]] = decision
        if time.monotonic() - started > RUN_BUDGET_S:
            violations.append(f"the run did not end within {RUN_BUDGET_S} s (status {status})")
            await _stop(env, run_id)
            return Played(run_id, time.monotonic() - started, False, decisions, violations)
        await asyncio.sleep(0.02)
    return Played(run_id, time.monotonic() - started, True, decisions, violations)


async def _stop(env: HostileEnv, run_id: str) -> None:
    """Cancel a run that overran (so it cannot eat the next example's script), by force if need be."""
    await env.client.post(f"/v1/workflow-runs/{run_id}/cancel", headers=env.tenant.headers)
    await env.harness.rt.pool.execute(
        "UPDATE workflow_runs SET status = 'CANCELLED', lease_owner = NULL, next_run_at = NULL "
        "WHERE id = $1 AND status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED')",
        run_id,
    )


async def _check(env: HostileEnv, script: Script, played: Played) -> list[str]:
    pool, run_id = env.harness.rt.pool, played.run_id
    v = list(played.violations)
    run = await pool.fetchrow("SELECT * FROM workflow_runs WHERE id = $1", run_id)
    steps = await pool.fetch("SELECT * FROM step_runs WHERE workflow_run_id = $1 ORDER BY attempt", run_id)
    calls = await pool.fetch(
        "SELECT * FROM llm_calls WHERE workflow_run_id = $1 ORDER BY created_at, round, id", run_id
    )
    traces = await pool.fetch("SELECT * FROM tool_trace WHERE workflow_run_id = $1", run_id)
    awaited = await pool.fetch(
        "SELECT a.*, r.id AS approval_id, r.decision FROM awaited_tool_calls a "
        "LEFT JOIN approval_requests r ON r.awaited_tool_call_id = a.id WHERE a.workflow_run_id = $1",
        run_id,
    )
    # What the handlers ran, and what the MCP server ran (its own log, under the name the model saw).
    effects = list(env.effects) + [
        Effect(f"{MCP_SERVER}_{c['tool']}", c["idempotencyKey"] or "(no key)", c["arguments"])
        for c in logged_calls(env.mcp_log)
    ]

    # -- the run ended, with a code when it failed
    if played.ended:
        if run["status"] not in ("COMPLETED", "FAILED"):
            v.append(f"run ended {run['status']}")
        if run["status"] == "FAILED" and not (run["error"] or {}).get("code"):
            v.append(f"run FAILED without an error code: {run['error']!r}")

    # -- nothing unoffered ran; gated calls ran only when we approved that very call
    for effect in effects:
        if effect.name not in EVERY_OFFERED:
            v.append(f"unoffered tool {effect.name!r} ran ({effect.key})")
    by_position = {
        (a["step_run_id"], a["round"], a["sequence"]): a for a in awaited if a["kind"] == "approval"
    }
    for effect in effects:
        if effect.name not in EVERY_GATED:
            continue
        step_run_id, round_no, index = effect.key.rsplit(":", 2)
        approval = by_position.get((step_run_id, int(round_no), int(index)))
        if approval is None or approval["status"] != "approved":
            v.append(f"gated call {effect.key} ran without an approval ({approval and approval['status']})")
            continue
        ours = played.decisions.get(approval["approval_id"])
        if ours not in ("approved", "edited") or approval["decision"] != ours:
            v.append(
                f"gated call {effect.key} ran after decision {approval['decision']!r} (we said {ours!r})"
            )
        if ours == "edited" and effect.args != EDITED:
            v.append(f"gated call {effect.key} ran with {effect.args!r}, not the edited arguments")
    executions = Counter(e.key for e in effects)
    for key, count in executions.items():
        if count > 1:
            v.append(f"call {key} executed {count} times")

    # -- every call of every committed round traced once, or refused with a code
    trace_at: dict[tuple[str, int], list[Any]] = {}
    for t in traces:
        trace_at.setdefault((t["llm_call_id"], t["sequence"]), []).append(t)
        if t["status"] == "failed" and not t["error_code"]:
            v.append(f"trace {t['id']} failed without an error code: {t['error']!r}")
    completed = [c for c in calls if c["status"] == "completed"]
    error_code = (run["error"] or {}).get("code")
    # A round asking for more tool calls than the budget has left runs its calls up to the limit;
    # the rest are not traced (the step failed with BUDGET_EXCEEDED).
    last_tool_call = next(
        (c["id"] for c in reversed(completed) if (c["response"] or {}).get("toolCalls")), None
    )
    tool_round = 0
    seen_positions: set[tuple[str, int]] = set()
    calls_in_rounds = 0
    for c in completed:
        asked = (c["response"] or {}).get("toolCalls") or []
        if not asked:
            continue
        tool_round += 1
        calls_in_rounds += len(asked)
        beyond = tool_round > script.max_tool_rounds
        for i, call in enumerate(asked):
            position = (c["id"], i)
            seen_positions.add(position)
            found = trace_at.get(position, [])
            if beyond:
                if found:
                    v.append(f"call {i} of the round past maxToolRounds was traced ({call['name']!r})")
                continue
            if not found and error_code == "BUDGET_EXCEEDED" and c["id"] == last_tool_call:
                STATS.refused["BUDGET_EXCEEDED (call not run)"] += 1
                continue
            if len(found) != 1:
                v.append(f"round {c['round']} call {i} ({call['name'][:40]!r}) has {len(found)} traces")
                continue
            t = found[0]
            # The trace keeps the first 64 characters of a name and 200 of an id (its columns).
            if t["tool_call_id"] != call["id"][:200] or t["tool_name"] != call["name"][:64]:
                v.append(
                    f"trace of round {c['round']} call {i} names {t['tool_name'][:40]!r}/{t['tool_call_id'][:40]!r}, "
                    f"the model said {call['name'][:40]!r}/{call['id'][:40]!r}"
                )
            if call["name"] not in EVERY_OFFERED and (t["status"], t["error_code"]) != (
                "failed",
                "TOOL_NOT_OFFERED",
            ):
                v.append(f"unoffered {call['name'][:40]!r} traced {t['status']}/{t['error_code']}")
            if t["status"] == "completed" and executions.get(t["idempotency_key"], 0) != 1:
                v.append(
                    f"completed trace {t['idempotency_key']} ran {executions.get(t['idempotency_key'], 0)} times"
                )
        if beyond:
            error = run["error"] or {}
            if run["status"] != "FAILED" or error.get("code") != "MAX_TOOL_ROUNDS":
                v.append(f"a round past maxToolRounds did not fail the run with MAX_TOOL_ROUNDS: {error!r}")
    for position in trace_at:
        if position not in seen_positions:
            v.append(f"trace at {position} answers no call of a committed round")
    traced_keys = Counter(t["idempotency_key"] for t in traces)
    for key in executions:
        if traced_keys[key] != 1:  # completed, or failed after running (e.g. TOOL_OUTPUT_TOO_LARGE)
            v.append(f"execution {key} has {traced_keys[key]} traces")

    # -- within budget
    if len(completed) > script.max_tool_rounds + 1:
        v.append(f"{len(completed)} completed model calls, maxToolRounds is {script.max_tool_rounds}")
    if len(steps) > STEP_ATTEMPTS:
        v.append(f"{len(steps)} step attempts, the retry policy allows {STEP_ATTEMPTS}")
    failed_calls = len(calls) - len(completed)
    if failed_calls > len(steps):
        v.append(f"{failed_calls} failed model calls in {len(steps)} step attempts")
    budget = script.budget or {}
    if "maxModelCalls" in budget and len(calls) > budget["maxModelCalls"]:
        v.append(f"{len(calls)} model calls, the budget allows {budget['maxModelCalls']}")
    counted = sum(1 for t in traces if t["error_code"] != "TOOL_NOT_OFFERED")
    if "maxToolCalls" in budget and counted > budget["maxToolCalls"]:
        v.append(f"{counted} tool calls, the budget allows {budget['maxToolCalls']}")
    if len(env.fake.requests) > len(calls) * (1 + script.sdk_retries):
        v.append(f"{len(env.fake.requests)} provider requests for {len(calls)} model calls")

    # -- the API and the UI read it all, and agree with the database
    v += await _read_back(env, run_id, run, len(traces), len(calls))

    STATS.calls_in_rounds += calls_in_rounds
    STATS.traced += len(traces)
    STATS.executed += len(effects)
    STATS.mcp_executed.update(e.name for e in effects if e.name.startswith(f"{MCP_SERVER}_"))
    for t in traces:
        if t["status"] == "failed":
            STATS.refused[t["error_code"] or "(none)"] += 1
    if tool_round > script.max_tool_rounds:
        last = [c for c in completed if (c["response"] or {}).get("toolCalls")][-1]
        STATS.refused["MAX_TOOL_ROUNDS (round not run)"] += len(last["response"]["toolCalls"])
    STATS.outcomes[run["status"] + (f":{error_code}" if error_code else "")] += 1
    return v


async def _read_back(env: HostileEnv, run_id: str, run: Any, traces: int, calls: int) -> list[str]:
    client, headers = env.client, env.tenant.headers
    v: list[str] = []
    base = f"/v1/workflow-runs/{run_id}"

    async def get(url: str, **kwargs: Any) -> httpx.Response | None:
        STATS.api_reads += 1
        try:
            response = await client.get(url, **kwargs)
        except Exception as exc:  # the app raised through the ASGI transport
            v.append(f"GET {url} raised {exc!r}"[:400])
            return None
        if response.status_code != 200:
            v.append(f"GET {url} answered {response.status_code}: {response.text[:300]}")
            return None
        return response

    detail = await get(base, headers=headers)
    if detail is not None and detail.json()["data"]["status"] != run["status"]:
        v.append(f"API status {detail.json()['data']['status']} != database {run['status']}")
    events, page_no = 0, 1
    while True:
        page = await get(f"{base}/events?page={page_no}&pageSize=100", headers=headers)
        if page is None:
            break
        events += len(page.json()["data"])
        if page_no >= page.json()["meta"]["totalPages"]:
            break
        page_no += 1
    if events != run["event_seq"]:
        v.append(f"API listed {events} events, the run has {run['event_seq']}")
    listed = await get(f"{base}/tool-traces", headers=headers)
    if listed is not None and len(listed.json()["data"]) != traces:
        v.append(f"API listed {len(listed.json()['data'])} tool traces, the database has {traces}")
    llm = await get(f"{base}/llm-calls", headers=headers)
    if llm is not None and len(llm.json()["data"]) != calls:
        v.append(f"API listed {len(llm.json()['data'])} LLM calls, the database has {calls}")
    await get(f"{base}/cost", headers=headers)
    await get("/v1/workflow-runs?pageSize=20", headers=headers)
    await get(f"/v1/approval-requests?workflowRunId={run_id}", headers=headers)
    await get(f"/ui/runs/{run_id}")
    await get("/ui/runs")
    return v


_SETTINGS = settings(
    max_examples=FULL_EXAMPLES if FULL else CI_EXAMPLES,
    derandomize=not FULL,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=list(HealthCheck),
    # STEVORA_HOSTILE_NO_SHRINK=1: report the first failing example as found (a diagnosis aid).
    phases=[
        p for p in Phase if not (p is Phase.shrink and os.environ.get("STEVORA_HOSTILE_NO_SHRINK") == "1")
    ],
)


@pytest.mark.timeout(3600 if FULL else 600)
@_SETTINGS
@given(script=scripts())
async def test_a_hostile_model_changes_nothing_it_may_not(env: HostileEnv, script: Script) -> None:
    await _run_example(env, script)


@pytest.mark.timeout(3600 if FULL else 600)
@_SETTINGS
@given(script=scripts(mcp_turns))
async def test_a_hostile_model_and_a_hostile_mcp_server_change_nothing_they_may_not(
    env: HostileEnv, script: Script
) -> None:
    """Mostly the MCP server's tools: hostile arguments and names, huge, deep and unstorable
    results, a broken image, and a server that dies mid-call (the next call restarts it)."""
    await _run_example(env, script)


async def _run_example(env: HostileEnv, script: Script) -> None:
    env.fake.reset()
    env.effects.clear()
    env.mcp_log.unlink(missing_ok=True)
    note(script.describe())
    providers = SdkProviders(env.harness, env.fake)
    providers.openai(max_retries=script.sdk_retries)
    providers.anthropic(max_retries=script.sdk_retries)
    try:
        with structlog.testing.capture_logs() as logs:
            played = await _play(env, script)
            violations = await _check(env, script, played)
    finally:
        await providers.aclose()
    # A step that raised (rather than returning a failure) met something the engine did not handle.
    crashes = [entry for entry in logs if entry.get("event") in ("run_driver_crashed", "step_raised")]
    errors = [entry for entry in logs if entry.get("log_level") in ("error", "critical")]
    for entry in crashes + errors:
        violations.append(f"worker logged {entry.get('log_level')} {entry.get('event')!r}: {entry}"[:600])
    STATS.runs += 1
    STATS.turns_generated += len(script.turns)
    STATS.budgeted += script.budget is not None
    STATS.calls_generated += script.calls
    STATS.model_requests += len(env.fake.requests)
    STATS.max_run_s = max(STATS.max_run_s, played.seconds)
    STATS.decisions.update(played.decisions.values())
    if violations:
        STATS.violations += len(violations)
    if violations:
        violations.append(await _diagnosis(env, played.run_id, logs))
    assert not violations, f"run {played.run_id}: " + "\n".join(violations)


async def _diagnosis(env: HostileEnv, run_id: str, logs: list[dict[str, Any]]) -> str:
    """What the rows say, for a failing example's report."""
    pool = env.harness.rt.pool
    run = await pool.fetchrow("SELECT status, error FROM workflow_runs WHERE id = $1", run_id)
    lines = [f"-- run {run['status']} {run['error']!r}"[:500]]
    for s in await pool.fetch("SELECT * FROM step_runs WHERE workflow_run_id = $1 ORDER BY attempt", run_id):
        lines.append(f"-- step attempt {s['attempt']} {s['status']} {s['error']!r}"[:500])
    for c in await pool.fetch(
        "SELECT * FROM llm_calls WHERE workflow_run_id = $1 ORDER BY created_at, round, id", run_id
    ):
        asked = len((c["response"] or {}).get("toolCalls") or [])
        lines.append(f"-- llm call round {c['round']} {c['status']} calls={asked} {c['error']!r}"[:500])
    traces = await pool.fetchval("SELECT count(*) FROM tool_trace WHERE workflow_run_id = $1", run_id)
    lines.append(f"-- traces {traces}; provider requests {[r.path for r in env.fake.requests]}")
    for entry in [e for e in logs if e.get("log_level") not in ("debug", "info")][:20]:
        tail = str(entry.get("exception") or entry.get("exc_info") or "")[-700:]
        lines.append(f"-- log {entry.get('log_level')} {entry.get('event')} {entry.get('error', '')} {tail}")
    return "\n".join(lines)
