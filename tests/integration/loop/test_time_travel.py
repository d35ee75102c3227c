"""Time travel through the HTTP API, the real driver, PostgreSQL and the fake model's SDK route:
fork points with their states, a fork at round 3 of a 5-round run, replay with recorded tools."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from stevora.api import create_app
from stevora.ids import new_id
from stevora.settings import Settings
from stevora.testing.fake_llm import FakeLLMServer, FakeResponse, openai_text, openai_tool_calls
from stevora.tools import ToolContext
from tests.conftest import Harness
from tests.integration.loop.conftest import SdkProviders, llm_step, load_run


def _round_of(body: dict[str, Any]) -> int:
    """The round a request is for: one more than the assistant turns it carries."""
    return 1 + sum(1 for m in body["messages"] if m["role"] == "assistant")


def _five_rounds(fake: FakeLLMServer, final: str = "done") -> None:
    """Rounds 1-4 each ask for `lookup(n=round)`; round 5 answers with the last tool result."""

    def respond(body: dict[str, Any]) -> FakeResponse:
        r = _round_of(body)
        if r < 5:
            return openai_tool_calls([(f"call_{r}", "lookup", json.dumps({"n": r}))])
        last = [m for m in body["messages"] if m["role"] == "tool"][-1]["content"]
        return openai_text(f"{final}: {last}")

    fake.openai.responder = respond


@pytest.fixture
async def api(
    harness: Harness, settings: Settings
) -> AsyncIterator[tuple[httpx.AsyncClient, dict[str, str]]]:
    app = create_app(settings, runtime=harness.rt)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        slug = new_id("t").replace("_", "-")
        ws = await client.post("/v1/workspaces", json={"name": "T", "slug": slug})
        key = await client.post("/v1/api-keys", json={"name": "k", "workspaceId": ws.json()["data"]["id"]})
        yield client, {"x-api-key": key.json()["data"]["key"]}


@pytest.fixture
def side_effects(harness: Harness) -> list[int]:
    ran: list[int] = []

    @harness.tools.tool
    async def lookup(n: int, ctx: ToolContext) -> str:
        """Look n up."""
        ran.append(n)
        ctx.update_state({f"seen{n}": n, "last": n})
        return f"result {n}"

    return ran


async def _origin(
    harness: Harness, api: tuple[httpx.AsyncClient, dict[str, str]], fake: FakeLLMServer
) -> dict[str, Any]:
    client, headers = api
    _five_rounds(fake)
    steps = [
        llm_step(tools=["lookup"], maxToolRounds=10),
        {"type": "wait", "name": "after", "durationMs": 1},
    ]
    body = {"definition": {"name": "tt", "steps": steps}, "input": {"question": "go"}}
    created = await client.post("/v1/workflow-runs", json=body, headers=headers)
    assert created.status_code == 201, created.text
    row = await harness.wait_for_status(created.json()["data"]["id"], "COMPLETED", "FAILED")
    assert row["status"] == "COMPLETED", row["error"]
    return dict(row)


async def test_checkpoints_list_every_round_with_the_state_recovered_from_the_log(
    harness: Harness, sdk: SdkProviders, fake: FakeLLMServer, api: Any, side_effects: list[int]
) -> None:
    origin = await _origin(harness, api, fake)
    client, headers = api
    got = await client.get(f"/v1/workflow-runs/{origin['id']}/checkpoints", headers=headers)
    assert got.status_code == 200, got.text
    points = got.json()["data"]
    assert [p["at"] for p in points] == [
        "agent",
        "agent:1",
        "agent:2",
        "agent:3",
        "agent:4",
        "agent:5",
        "after",
    ]
    by_at = {p["at"]: p for p in points}
    # Before round 3: the tools of rounds 1 and 2 had run (and only they).
    assert by_at["agent:3"]["state"] == {"seen1": 1, "seen2": 2, "last": 2}
    assert by_at["agent"]["state"] == {}
    # Before the next step: every tool change and the llm step's own output key.
    # Before the next step: every tool change and the llm step's output, which is (the wait step
    # changing nothing) the run's final stored state: the log misses nothing.
    assert by_at["after"]["state"] == origin["state"]
    assert origin["state"]["last"] == 4 and "seen4" in origin["state"]
    assert by_at["agent:3"]["next"]["toolCallIds"] == ["call_3"]
    assert by_at["agent:5"]["next"]["toolCallIds"] == []


async def test_fork_at_round_3_inherits_rounds_1_2_and_sees_the_edited_result(
    harness: Harness, sdk: SdkProviders, fake: FakeLLMServer, api: Any, side_effects: list[int]
) -> None:
    origin = await _origin(harness, api, fake)
    client, headers = api
    assert side_effects == [1, 2, 3, 4]
    side_effects.clear()
    sent_before = len(fake.openai.requests)
    body = {
        "at": {"step": "agent", "round": 3},
        "edits": {"state": {"flag": True}, "toolResults": {"call_2": "EDITED two"}},
    }
    made = await client.post(
        f"/v1/workflow-runs/{origin['id']}/fork", json=body, headers={**headers, "Idempotency-Key": "f1"}
    )
    assert made.status_code == 201, made.text
    fork_id = made.json()["data"]["id"]
    assert made.json()["data"]["forkedFrom"] == {"runId": origin["id"], "stepName": "agent", "round": 3}
    row = await harness.wait_for_status(fork_id, "COMPLETED", "FAILED")
    assert row["status"] == "COMPLETED", row["error"]
    # The same key answers with the same fork, nothing new.
    again = await client.post(
        f"/v1/workflow-runs/{origin['id']}/fork", json=body, headers={**headers, "Idempotency-Key": "f1"}
    )
    assert again.status_code == 200 and again.json()["data"]["id"] == fork_id
    # Rounds 1-2 were never sent again: the fork's first model call is round 3, carrying them.
    sent = [r.json for r in fake.openai.requests[sent_before:]]
    assert [_round_of(b) for b in sent] == [3, 4, 5]
    tool_msgs = [m for m in sent[0]["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in tool_msgs] == ["result 1", "EDITED two"]
    # Nor were their tools run: only rounds 3 and 4's calls ran.
    assert side_effects == [3, 4]
    fork = await load_run(harness, fork_id)
    inherited = [c for c in fork.llm_calls if c["inherited_from"] is not None]
    assert [c["round"] for c in inherited] == [1, 2]
    assert [c["round"] for c in fork.llm_calls if c["inherited_from"] is None] == [3, 4, 5]
    origin_keys = {t["round"]: t["idempotency_key"] for t in (await load_run(harness, origin["id"])).traces}
    kept = {t["round"]: t["idempotency_key"] for t in fork.traces if t["inherited_from"] is not None}
    assert kept == {1: origin_keys[1], 2: origin_keys[2]}
    # The API says which rows were inherited, and from which of the origin's rows.
    origin_rows = await load_run(harness, origin["id"])
    api_traces = (await client.get(f"/v1/workflow-runs/{fork_id}/tool-traces", headers=headers)).json()[
        "data"
    ]
    by_round = {t["round"]: t["id"] for t in origin_rows.traces}
    assert [(t["round"], t["inheritedFrom"]) for t in api_traces] == [
        (1, by_round[1]),
        (2, by_round[2]),
        (3, None),
        (4, None),
    ]
    api_calls = (await client.get(f"/v1/workflow-runs/{fork_id}/llm-calls", headers=headers)).json()["data"]
    calls_by_round = {c["round"]: c["id"] for c in origin_rows.llm_calls}
    assert [c["inheritedFrom"] for c in api_calls] == [calls_by_round[1], calls_by_round[2], None, None, None]
    assert fork.state["flag"] is True and fork.state["seen1"] == 1 and fork.state["last"] == 4
    assert "WORKFLOW_FORKED" in fork.event_types()
    assert "WORKFLOW_FORKED" in await harness.event_types(origin["id"])
    lineage = (await client.get(f"/v1/workflow-runs/{origin['id']}/lineage", headers=headers)).json()["data"]
    assert [f["runId"] for f in lineage["forks"]] == [fork_id]
    # The fork's own fork points: its fork point shows the edited state.
    points = (await client.get(f"/v1/workflow-runs/{fork_id}/checkpoints", headers=headers)).json()["data"]
    at3 = next(p for p in points if p["at"] == "agent:3")
    assert at3["state"] == {"seen1": 1, "seen2": 2, "last": 2, "flag": True}
    assert [p["inherited"] for p in points if p["stepName"] == "agent" and p["round"]] == [
        True,
        True,
        False,
        False,
        False,
    ]


async def test_fork_errors_name_the_field_and_store_nothing(
    harness: Harness, sdk: SdkProviders, fake: FakeLLMServer, api: Any, side_effects: list[int]
) -> None:
    origin = await _origin(harness, api, fake)
    client, headers = api
    count = await harness.rt.pool.fetchval("SELECT count(*) FROM workflow_runs")
    cases = [
        ({"at": {"step": "agent", "round": 9}}, "at"),
        ({"at": {"step": "nope"}}, "at"),
        (
            {"at": {"step": "agent", "round": 3}, "edits": {"toolResults": {"call_1": "x"}}},
            "edits.toolResults.call_1",
        ),
        ({"at": {"step": "agent", "round": 3}, "edits": {"model": "nomodel-x"}}, "edits.model"),
        ({"edits": {}}, "at"),
    ]
    for body, path in cases:
        got = await client.post(f"/v1/workflow-runs/{origin['id']}/fork", json=body, headers=headers)
        assert got.status_code == 400, got.text
        assert got.json()["error"]["details"]["errors"][0]["path"] == path, got.text
    assert await harness.rt.pool.fetchval("SELECT count(*) FROM workflow_runs") == count


async def test_replay_with_recorded_tools_runs_no_handler(
    harness: Harness, sdk: SdkProviders, fake: FakeLLMServer, api: Any, side_effects: list[int]
) -> None:
    origin = await _origin(harness, api, fake)
    client, headers = api
    side_effects.clear()

    _other_model_asks_99_at_round_4(fake)
    made = await client.post(
        f"/v1/workflow-runs/{origin['id']}/replay",
        json={"model": "gpt-4.1-mini", "tools": "recorded"},
        headers=headers,
    )
    assert made.status_code == 201, made.text
    replay_id = made.json()["data"]["id"]
    assert made.json()["data"]["replayOf"] == origin["id"]
    row = await harness.wait_for_status(replay_id, "COMPLETED", "FAILED")
    assert row["status"] == "COMPLETED", row["error"]
    assert side_effects == []  # no handler ran
    assert fake.openai.requests[-1].json["model"] == "gpt-4.1-mini"
    replay = await load_run(harness, replay_id)
    texts = [(t["tool_call_id"], t["status"], t["output_json"]) for t in replay.traces]
    assert texts[:3] == [
        ("new_1", "completed", "result 1"),
        ("new_2", "completed", "result 2"),
        ("new_3", "completed", "result 3"),
    ]
    assert texts[3][1] == "failed" and replay.traces[3]["error_code"] == "TOOL_CALL_NOT_RECORDED"
    assert replay.state["seen2"] == 2  # the recorded update_state applied
    lineage = (await client.get(f"/v1/workflow-runs/{replay_id}/lineage", headers=headers)).json()["data"]
    assert lineage["toolCalls"] == {"matched": 3, "unmatched": 1, "live": 0}


async def test_forks_of_forks_and_a_fork_before_a_step(
    harness: Harness, sdk: SdkProviders, fake: FakeLLMServer, api: Any, side_effects: list[int]
) -> None:
    origin = await _origin(harness, api, fake)
    client, headers = api
    url = f"/v1/workflow-runs/{origin['id']}/fork"
    first = await client.post(
        url, json={"at": "agent:3", "edits": {"toolResults": {"call_2": "E2"}}}, headers=headers
    )
    assert first.status_code == 201, first.text
    f1 = first.json()["data"]["id"]
    await harness.wait_for_status(f1, "COMPLETED")
    side_effects.clear()
    sent_before = len(fake.openai.requests)
    # A fork of the fork at round 4 inherits rounds 1-3 from it, the edited result included.
    second = await client.post(f"/v1/workflow-runs/{f1}/fork", json={"at": "agent:4"}, headers=headers)
    assert second.status_code == 201, second.text
    f2 = second.json()["data"]["id"]
    await harness.wait_for_status(f2, "COMPLETED")
    sent = [r.json for r in fake.openai.requests[sent_before:]]
    assert [_round_of(b) for b in sent] == [4, 5]
    assert [m["content"] for m in sent[0]["messages"] if m["role"] == "tool"] == [
        "result 1",
        "E2",
        "result 3",
    ]
    assert side_effects == [4]
    # A fork before the `after` step: the llm step is inherited whole, nothing is sent or run.
    side_effects.clear()
    sent_before = len(fake.openai.requests)
    third = await client.post(url, json={"at": "after", "edits": {"state": {"last": 0}}}, headers=headers)
    assert third.status_code == 201, third.text
    row = await harness.wait_for_status(third.json()["data"]["id"], "COMPLETED", "FAILED")
    assert row["status"] == "COMPLETED", row["error"]
    assert len(fake.openai.requests) == sent_before and side_effects == []
    assert row["state"]["last"] == 0 and row["state"]["seen4"] == 4
    steps = await harness.rt.pool.fetch(
        "SELECT step_name, inherited_from FROM step_runs WHERE workflow_run_id = $1 ORDER BY created_at, step_index",
        row["id"],
    )
    assert [(s["step_name"], s["inherited_from"] is not None) for s in steps] == [
        ("agent", True),
        ("after", False),
    ]


async def test_a_fork_that_fails_half_way_leaves_nothing(
    harness: Harness,
    sdk: SdkProviders,
    fake: FakeLLMServer,
    api: Any,
    side_effects: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    origin = await _origin(harness, api, fake)
    client, headers = api
    from stevora.db import forks as db_forks

    async def crash(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the worker died after copying the model calls")

    monkeypatch.setattr(db_forks, "copy_traces", crash)
    counts = (
        "SELECT (SELECT count(*) FROM workflow_runs), (SELECT count(*) FROM llm_calls), "
        "(SELECT count(*) FROM step_runs), (SELECT count(*) FROM workflow_events)"
    )
    before = await harness.rt.pool.fetchrow(counts)
    got = await client.post(f"/v1/workflow-runs/{origin['id']}/fork", json={"at": "agent:3"}, headers=headers)
    assert got.status_code == 500
    assert await harness.rt.pool.fetchrow(counts) == before


async def test_cost_summary_counts_inherited_calls_once_and_replays_only_when_asked(
    harness: Harness, sdk: SdkProviders, fake: FakeLLMServer, api: Any, side_effects: list[int]
) -> None:
    origin = await _origin(harness, api, fake)
    client, headers = api
    fork = await client.post(
        f"/v1/workflow-runs/{origin['id']}/fork", json={"at": "agent:3"}, headers=headers
    )
    await harness.wait_for_status(fork.json()["data"]["id"], "COMPLETED")
    replay = await client.post(f"/v1/workflow-runs/{origin['id']}/replay", json={}, headers=headers)
    await harness.wait_for_status(replay.json()["data"]["id"], "COMPLETED")
    summary = (await client.get("/v1/cost/summary", headers=headers)).json()["data"]
    # 5 origin calls + the fork's own rounds 3-5 (its rounds 1-2 are the origin's).
    assert summary["callCount"] == 5 + 3
    with_replays = (await client.get("/v1/cost/summary?includeReplays=true", headers=headers)).json()["data"]
    assert with_replays["callCount"] == 5 + 3 + 5


def _other_model_asks_99_at_round_4(fake: FakeLLMServer) -> None:
    """The "other model": the origin's first three lookups, then one the origin never made."""

    def respond(body: dict[str, Any]) -> FakeResponse:
        r = _round_of(body)
        if r <= 3:
            return openai_tool_calls([(f"new_{r}", "lookup", json.dumps({"n": r}))])
        if r == 4:
            return openai_tool_calls([("new_4", "lookup", json.dumps({"n": 99}))])
        return openai_text("replayed")

    fake.openai.responder = respond


async def test_replay_runs_unmatched_calls_live_only_when_allowed(
    harness: Harness, sdk: SdkProviders, fake: FakeLLMServer, api: Any, side_effects: list[int]
) -> None:
    origin = await _origin(harness, api, fake)
    client, headers = api
    side_effects.clear()
    _other_model_asks_99_at_round_4(fake)
    bad = await client.post(
        f"/v1/workflow-runs/{origin['id']}/replay", json={"unmatched": "sometimes"}, headers=headers
    )
    assert bad.status_code == 400 and bad.json()["error"]["details"]["errors"][0]["path"] == "unmatched"
    made = await client.post(
        f"/v1/workflow-runs/{origin['id']}/replay", json={"unmatched": "live"}, headers=headers
    )
    assert made.status_code == 201, made.text
    replay_id = made.json()["data"]["id"]
    row = await harness.wait_for_status(replay_id, "COMPLETED", "FAILED")
    assert row["status"] == "COMPLETED", row["error"]
    assert side_effects == [99]  # only the unmatched call ran, live; the three matched did not
    replay = await load_run(harness, replay_id)
    assert [(t["status"], t["output_json"]) for t in replay.traces] == [
        ("completed", "result 1"),
        ("completed", "result 2"),
        ("completed", "result 3"),
        ("completed", "result 99"),
    ]
    assert replay.state["seen99"] == 99
    lineage = (await client.get(f"/v1/workflow-runs/{replay_id}/lineage", headers=headers)).json()["data"]
    assert lineage["toolCalls"] == {"matched": 3, "unmatched": 1, "live": 1}


async def test_replay_against_another_definition_version(
    harness: Harness, sdk: SdkProviders, fake: FakeLLMServer, api: Any, side_effects: list[int]
) -> None:
    origin = await _origin(harness, api, fake)
    client, headers = api
    side_effects.clear()
    # Version 2 of "tt": a step before the agent, another system prompt, no wait step after it.
    v2 = {
        "name": "tt",
        "version": "2",
        "steps": [
            {"type": "wait", "name": "warmup", "durationMs": 1},
            llm_step(tools=["lookup"], maxToolRounds=10, systemPrompt="Version two."),
        ],
    }
    stored = await client.post("/v1/workflow-definitions", json=v2, headers=headers)
    assert stored.status_code in (200, 201), stored.text
    missing = await client.post(
        f"/v1/workflow-runs/{origin['id']}/replay", json={"definitionVersion": "9"}, headers=headers
    )
    assert missing.status_code == 400
    assert missing.json()["error"]["details"]["errors"][0]["path"] == "definitionVersion"
    sent_before = len(fake.openai.requests)
    made = await client.post(
        f"/v1/workflow-runs/{origin['id']}/replay",
        json={"definitionVersion": "2", "model": "gpt-4.1-mini"},
        headers=headers,
    )
    assert made.status_code == 201, made.text
    replay_id = made.json()["data"]["id"]
    row = await harness.wait_for_status(replay_id, "COMPLETED", "FAILED")
    assert row["status"] == "COMPLETED", row["error"]
    assert side_effects == []
    steps = await harness.rt.pool.fetch(
        "SELECT step_name FROM step_runs WHERE workflow_run_id = $1 ORDER BY created_at, step_index",
        replay_id,
    )
    assert [s["step_name"] for s in steps] == ["warmup", "agent"]  # version 2's steps, not 1's
    first = fake.openai.requests[sent_before].json
    assert first["model"] == "gpt-4.1-mini"
    assert first["messages"][0] == {"role": "system", "content": "Version two."}
    version = await harness.rt.pool.fetchval(
        "SELECT d.version FROM workflow_runs r JOIN workflow_definitions d ON d.id = r.definition_id "
        "WHERE r.id = $1",
        replay_id,
    )
    assert version.startswith("2+fork-")  # version 2 with the model edit


async def test_bulk_replay_of_the_last_runs_and_their_comparison(
    harness: Harness, sdk: SdkProviders, fake: FakeLLMServer, api: Any, side_effects: list[int]
) -> None:
    client, headers = api
    origins = [await _origin(harness, api, fake) for _ in range(3)]
    side_effects.clear()
    _other_model_asks_99_at_round_4(fake)
    count = await harness.rt.pool.fetchval("SELECT count(*) FROM workflow_runs")
    bad = await client.post("/v1/replays", json={"definition": "tt", "model": "nomodel-x"}, headers=headers)
    assert bad.status_code == 400 and bad.json()["error"]["details"]["errors"][0]["path"] == "model"
    neither = await client.post("/v1/replays", json={"last": 2}, headers=headers)
    assert neither.status_code == 400
    assert await harness.rt.pool.fetchval("SELECT count(*) FROM workflow_runs") == count
    made = await client.post(
        "/v1/replays",
        json={"definition": "tt", "last": 2, "model": "gpt-4.1-mini", "idempotencyKey": "b1"},
        headers=headers,
    )
    assert made.status_code == 201, made.text
    rows = made.json()["data"]["replays"]
    # The last two runs, newest first.
    assert [r["runId"] for r in rows] == [origins[2]["id"], origins[1]["id"]]
    replay_ids = [r["replayId"] for r in rows]
    again = await client.post(
        "/v1/replays",
        json={"definition": "tt", "last": 2, "model": "gpt-4.1-mini", "idempotencyKey": "b1"},
        headers=headers,
    )
    assert [r["replayId"] for r in again.json()["data"]["replays"]] == replay_ids  # the same replays
    for replay_id in replay_ids:
        await harness.wait_for_status(replay_id, "COMPLETED", "FAILED")
    assert side_effects == []
    got = await client.get(f"/v1/replays/compare?runs={','.join(replay_ids)}", headers=headers)
    assert got.status_code == 200, got.text
    comparison = got.json()["data"]
    assert comparison["done"] is True and comparison["unknown"] == []
    for row, origin in zip(comparison["runs"], [origins[2], origins[1]], strict=True):
        assert row["runId"] == origin["id"]
        o, r = row["origin"], row["replay"]
        assert (o["status"], r["status"]) == ("COMPLETED", "COMPLETED")
        assert (o["rounds"], r["rounds"]) == (5, 5)
        assert r["toolCalls"] == {"matched": 3, "unmatched": 1, "live": 0}
        assert o["toolCalls"] == {"total": 4}
        assert o["output"] == origin["output"] and r["output"]["agent"].startswith("replayed")
        assert row["sameOutput"] is False and row["sameStatus"] is True
        assert r["inputTokens"] > 0 and o["inputTokens"] > 0
        assert o["latencyMs"] is not None and r["latencyMs"] is not None
        replay_row = await harness.rt.pool.fetchrow(
            "SELECT total_input_tokens, total_cost_cents FROM workflow_runs WHERE id = $1", row["replayId"]
        )
        assert r["inputTokens"] == replay_row["total_input_tokens"]
        assert r["costUsd"] == round(replay_row["total_cost_cents"] / 100, 10)
    listed = await client.post(
        "/v1/replays", json={"runIds": [origins[0]["id"], "wfrun_nope"]}, headers=headers
    )
    assert listed.status_code == 201, listed.text
    first, missing = listed.json()["data"]["replays"]
    assert first["replayId"] and missing["replayId"] is None and missing["error"]["code"] == "NOT_FOUND"
    not_replay = (await client.get(f"/v1/replays/compare?runs={origins[0]['id']}", headers=headers)).json()
    assert not_replay["data"]["unknown"] == [origins[0]["id"]]


async def test_a_fork_is_announced_by_webhook(
    harness: Harness, sdk: SdkProviders, fake: FakeLLMServer, api: Any, side_effects: list[int]
) -> None:
    origin = await _origin(harness, api, fake)
    client, headers = api
    hook = await client.post(
        "/v1/webhooks",
        json={"url": "https://hooks.example.com/stevora", "events": ["workflow.forked"]},
        headers=headers,
    )
    assert hook.status_code == 201, hook.text
    made = await client.post(
        f"/v1/workflow-runs/{origin['id']}/fork", json={"at": "agent:3"}, headers=headers
    )
    fork_id = made.json()["data"]["id"]
    rows = await harness.rt.pool.fetch(
        "SELECT event, payload FROM webhook_deliveries WHERE webhook_id = $1", hook.json()["data"]["id"]
    )
    assert [r["event"] for r in rows] == ["workflow.forked"]
    data = rows[0]["payload"]["data"]
    assert data["workflowRunId"] == fork_id
    assert data["forkedFrom"] == {"runId": origin["id"], "stepName": "agent", "round": 3}
    assert data["replayOf"] is None
