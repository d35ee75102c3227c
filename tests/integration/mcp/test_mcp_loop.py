"""MCP tools in the tool loop (docs/mcp.md), with our counting server over stdio and HTTP and the
fake OpenAI API through the real SDK: each call traced once with its event, the idempotency key in
`_meta`, the tool boundary (excluded, not included), `isError`, pinned lists, a killed server,
approval, replay with recorded tools (zero server calls), and the API's view of it all."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from stevora.api import create_app
from stevora.engine import commands
from stevora.ids import new_id
from stevora.mcp.manager import McpClientManager
from stevora.settings import Settings
from stevora.testing.fake_llm import (
    FakeLLMServer,
    anthropic_text,
    anthropic_tool_use,
    openai_text,
    openai_tool_calls,
)
from stevora.ui.auth import COOKIE_NAME
from tests.conftest import Harness, create_definition
from tests.integration.loop.conftest import (
    SdkProviders,
    anthropic_messages,
    llm_step,
    load_run,
    openai_messages,
    run_workflow,
)
from tests.integration.loop.test_loop_basics import assert_trace_event_consistency
from tests.mcp_servers import counting_http, counting_stdio, logged_calls

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def call_log(tmp_path: Path) -> Path:
    return tmp_path / "calls.jsonl"


@pytest.fixture
async def with_count(harness: Harness, call_log: Path) -> AsyncIterator[McpClientManager]:
    """The harness's worker with the counting server as its own stdio server `count`."""
    manager = McpClientManager({"count": counting_stdio(call_log)})
    harness.rt.mcp = manager
    yield manager
    await manager.close()


@pytest.fixture
async def api(
    harness: Harness, settings: Settings
) -> AsyncIterator[tuple[httpx.AsyncClient, dict[str, str], str]]:
    app = create_app(settings.model_copy(update={"mcp_allow_private": True}), runtime=harness.rt)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        slug = new_id("t").replace("_", "-")
        ws = await client.post("/v1/workspaces", json={"name": "T", "slug": slug})
        ws_id = ws.json()["data"]["id"]
        key = await client.post("/v1/api-keys", json={"name": "k", "workspaceId": ws_id})
        yield client, {"x-api-key": key.json()["data"]["key"]}, ws_id


def _offered(fake: FakeLLMServer, index: int = 0) -> list[str]:
    return [t["function"]["name"] for t in fake.openai.requests[index].json.get("tools", [])]


async def test_an_agent_using_mcp_tools_completes_with_each_call_traced_once(
    harness: Harness,
    workspace_id: str,
    fake: FakeLLMServer,
    sdk: SdkProviders,
    with_count: Any,
    call_log: Path,
) -> None:
    fake.openai.enqueue(
        openai_tool_calls([("c1", "count_add", '{"a": 2, "b": 40}'), ("c2", "count_echo", '{"text": "hi"}')]),
        openai_tool_calls([("c3", "count_fail", '{"message": "nope"}')]),
        openai_text("42"),
    )
    step = llm_step(tools=[{"mcp": "count", "exclude": ["whoami", "slow", "pixel"]}])
    result = await run_workflow(harness, workspace_id, step)

    assert result.status == "COMPLETED", result.run["error"]
    assert sorted(_offered(fake)) == ["count_add", "count_echo", "count_fail"]
    traces = [(t["tool_name"], t["status"], t["error_code"], t["output_json"]) for t in result.traces]
    assert traces == [
        ("count_add", "completed", None, {"sum": 42}),
        ("count_echo", "completed", None, {"result": "hi"}),
        ("count_fail", "failed", "TOOL_ERROR", None),
    ]
    await assert_trace_event_consistency(harness, result.id)
    # The server ran each call exactly once, with the call's idempotency key in `_meta`.
    calls = logged_calls(call_log)
    # add and echo are one round's parallel calls: they reach the server in either order.
    assert sorted(c["tool"] for c in calls[:2]) == ["add", "echo"] and calls[2]["tool"] == "fail"
    keys = {t["tool_name"].removeprefix("count_"): t["idempotency_key"] for t in result.traces}
    assert {c["tool"]: c["idempotencyKey"] for c in calls} == keys
    assert len(calls) == 3
    # The model read the server's error text (isError), as for a raising handler.
    failed = [m for m in openai_messages(fake, 2) if m["role"] == "tool"][-1]
    assert json.loads(failed["content"]) == {"error": "Error executing tool fail: nope"}
    # The list the step saw is pinned with the server's name and version.
    pin = await harness.rt.pool.fetchrow("SELECT * FROM mcp_tool_pins WHERE workflow_run_id = $1", result.id)
    assert (pin["server"], pin["server_name"], pin["server_version"]) == ("count", "counting", "1.2.3")
    assert {t["name"] for t in pin["tools"]} == {"echo", "add", "slow", "fail", "pixel", "whoami"}


async def test_an_excluded_or_not_included_mcp_tool_never_runs(
    harness: Harness,
    workspace_id: str,
    fake: FakeLLMServer,
    sdk: SdkProviders,
    with_count: Any,
    call_log: Path,
) -> None:
    fake.openai.enqueue(
        openai_tool_calls(
            [
                ("c1", "count_whoami", "{}"),
                ("c2", "count_fail", '{"message": "x"}'),
                ("c3", "cnt_echo", '{"text": "ok"}'),
            ]
        ),
        openai_text("done"),
    )
    step = llm_step(
        tools=[{"mcp": "count", "include": ["echo", "fail"], "exclude": ["fail"], "prefix": "cnt"}]
    )
    result = await run_workflow(harness, workspace_id, step)

    assert result.status == "COMPLETED", result.run["error"]
    assert _offered(fake) == ["cnt_echo"]
    codes = [(t["tool_name"], t["error_code"]) for t in result.traces]
    assert codes == [
        ("count_whoami", "TOOL_NOT_OFFERED"),
        ("count_fail", "TOOL_NOT_OFFERED"),
        ("cnt_echo", None),
    ]
    assert [c["tool"] for c in logged_calls(call_log)] == ["echo"]


async def test_a_resumed_step_offers_the_pinned_list_and_a_vanished_tool_is_an_error_result(
    harness: Harness,
    workspace_id: str,
    fake: FakeLLMServer,
    sdk: SdkProviders,
    with_count: Any,
    call_log: Path,
) -> None:
    fake.openai.enqueue(
        openai_tool_calls([("c1", "count_vanished", "{}"), ("c2", "count_add", '{"a": 1, "b": 1}')]),
        openai_text("done"),
    )
    spec = {
        "name": "pinned",
        "version": "1",
        "steps": [{"type": "wait", "name": "pause", "durationMs": 800}, llm_step(tools=[{"mcp": "count"}])],
    }
    def_id = await create_definition(harness.rt, workspace_id, spec)
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id, {"question": "?"})
    # As if an earlier execution of the step had pinned the server's list, before the server changed.
    listed = [
        {
            "name": "vanished",
            "description": "gone since",
            "inputSchema": {"type": "object", "properties": {}},
        },
        {
            "name": "add",
            "description": "Add",
            "inputSchema": {"type": "object", "properties": {"a": {}, "b": {}}},
        },
    ]
    await harness.rt.pool.execute(
        "INSERT INTO mcp_tool_pins (workflow_run_id, step_name, server, tools, server_name, server_version) "
        "VALUES ($1, 'agent', 'count', $2, 'counting', '1.0.0')",
        run["id"],
        listed,
    )
    row = await harness.wait_for_status(run["id"], "COMPLETED", "FAILED")
    assert row["status"] == "COMPLETED", row["error"]
    assert _offered(fake) == ["count_vanished", "count_add"]  # exactly the pinned list
    result = await load_run(harness, run["id"])
    (vanished, added) = result.traces
    assert vanished["status"] == "failed" and "vanished" in vanished["error"]
    assert added["output_json"] == {"sum": 2}


async def test_killing_the_stdio_server_mid_call_gives_an_error_result_and_the_next_call_works(
    harness: Harness,
    workspace_id: str,
    fake: FakeLLMServer,
    sdk: SdkProviders,
    with_count: Any,
    call_log: Path,
) -> None:
    fake.openai.enqueue(
        openai_tool_calls([("c1", "count_slow", '{"seconds": 20}')]),
        openai_tool_calls([("c2", "count_echo", '{"text": "after"}')]),
        openai_text("done"),
    )
    def_id = await create_definition(
        harness.rt,
        workspace_id,
        {"name": "kill", "version": "1", "steps": [llm_step(tools=[{"mcp": "count"}])]},
    )
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id, {"question": "?"})
    for _ in range(600):
        calls = logged_calls(call_log)
        if calls:
            break
        await asyncio.sleep(0.05)
    os.kill(calls[0]["pid"], signal.SIGKILL)
    row = await harness.wait_for_status(run["id"], "COMPLETED", "FAILED", timeout_s=60)
    assert row["status"] == "COMPLETED", row["error"]
    result = await load_run(harness, run["id"])
    slow, echo = result.traces
    assert (slow["status"], slow["error_code"]) == ("failed", "MCP_SERVER_UNAVAILABLE")
    assert echo["output_json"] == {"result": "after"}
    error_seen = [m for m in openai_messages(fake, 1) if m["role"] == "tool"][-1]
    assert "closed the connection" in json.loads(error_seen["content"])["error"]
    assert len({c["pid"] for c in logged_calls(call_log)}) == 2  # the restarted server answered


async def test_an_mcp_tool_listed_in_approve_waits_for_a_person_then_runs(
    harness: Harness,
    workspace_id: str,
    fake: FakeLLMServer,
    sdk: SdkProviders,
    with_count: Any,
    call_log: Path,
) -> None:
    from stevora.engine.steps.approval import decide_approval

    fake.openai.enqueue(
        openai_tool_calls([("c1", "count_echo", '{"text": "sensitive"}')]), openai_text("done")
    )
    def_id = await create_definition(
        harness.rt,
        workspace_id,
        {"name": "gated", "version": "1", "steps": [llm_step(tools=[{"mcp": "count", "approve": ["echo"]}])]},
    )
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id, {"question": "?"})
    await harness.wait_for_status(run["id"], "WAITING")
    assert logged_calls(call_log) == []  # nothing ran before the decision
    approval = await harness.rt.pool.fetchrow(
        "SELECT id FROM approval_requests WHERE workflow_run_id = $1", run["id"]
    )
    await decide_approval(harness.rt, workspace_id, approval["id"], "approved", decided_by="ann")
    row = await harness.wait_for_status(run["id"], "COMPLETED", "FAILED")
    assert row["status"] == "COMPLETED", row["error"]
    assert [c["tool"] for c in logged_calls(call_log)] == ["echo"]


async def test_registered_http_server_replay_and_the_api_view(
    harness: Harness, fake: FakeLLMServer, sdk: SdkProviders, api: Any, call_log: Path
) -> None:
    client, headers, ws_id = api
    with counting_http(call_log) as url:
        made = await client.post(
            "/v1/mcp-servers",
            json={"name": "remote", "url": url, "headers": {"Authorization": "Bearer s3cret"}},
            headers=headers,
        )
        assert made.status_code == 201, made.text
        assert "s3cret" not in made.text and made.json()["data"]["headerNames"] == ["Authorization"]
        listed = await client.get("/v1/mcp-servers", headers=headers)
        assert "s3cret" not in listed.text and [s["name"] for s in listed.json()["data"]["registered"]] == [
            "remote"
        ]

        unknown = await client.post(
            "/v1/workflow-definitions",
            json={"name": "bad", "version": "1", "steps": [llm_step(tools=[{"mcp": "nowhere"}])]},
            headers=headers,
        )
        assert unknown.status_code == 400
        assert unknown.json()["error"]["details"]["errors"][0]["path"] == "steps[0].tools[0].mcp"

        definition = await client.post(
            "/v1/workflow-definitions",
            json={"name": "remote-agent", "version": "1", "steps": [llm_step(tools=[{"mcp": "remote"}])]},
            headers=headers,
        )
        assert definition.status_code == 201, definition.text
        fake.openai.enqueue(
            openai_tool_calls([("c1", "remote_add", '{"a": 20, "b": 22}')]),
            openai_text("42"),
        )
        started = await client.post(
            "/v1/workflow-runs",
            json={"definitionId": definition.json()["data"]["id"], "input": {"question": "?"}},
            headers=headers,
        )
        assert started.status_code == 201, started.text
        run_id = started.json()["data"]["id"]
        row = await harness.wait_for_status(run_id, "COMPLETED", "FAILED")
        assert row["status"] == "COMPLETED", row["error"]
        assert [c["tool"] for c in logged_calls(call_log)] == ["add"]

        traces = (await client.get(f"/v1/workflow-runs/{run_id}/tool-traces", headers=headers)).json()["data"]
        (trace,) = traces
        assert (trace["source"], trace["mcpServer"], trace["mcpTool"], trace["toolName"]) == (
            "mcp",
            "remote",
            "add",
            "remote_add",
        )
        assert trace["mcpServerVersion"] == "counting 1.2.3"

        fake.openai.enqueue(
            openai_tool_calls([("c1", "remote_add", '{"a": 20, "b": 22}')]), openai_text("42")
        )
        replayed = await client.post(
            f"/v1/workflow-runs/{run_id}/replay", json={"tools": "recorded"}, headers=headers
        )
        assert replayed.status_code == 201, replayed.text
        replay_id = replayed.json()["data"]["id"]
        row = await harness.wait_for_status(replay_id, "COMPLETED", "FAILED")
        assert row["status"] == "COMPLETED", row["error"]
        replay = await load_run(harness, replay_id)
        assert [(t["tool_name"], t["output_json"]) for t in replay.traces] == [("remote_add", {"sum": 42})]
        # Answered from the recording: the server executed nothing more.
        assert [c["tool"] for c in logged_calls(call_log)] == ["add"]

        other = await client.post("/v1/workspaces", json={"name": "O", "slug": new_id("o").replace("_", "-")})
        other_key = await client.post(
            "/v1/api-keys", json={"name": "k", "workspaceId": other.json()["data"]["id"]}
        )
        other_headers = {"x-api-key": other_key.json()["data"]["key"]}
        theirs = await client.get("/v1/mcp-servers", headers=other_headers)
        assert theirs.json()["data"]["registered"] == []  # a workspace's server is its own
        refused = await client.post(
            "/v1/workflow-definitions",
            json={"name": "steal", "version": "1", "steps": [llm_step(tools=[{"mcp": "remote"}])]},
            headers=other_headers,
        )
        assert refused.status_code == 400
        client.cookies.set(COOKIE_NAME, headers["x-api-key"])
        try:
            ui = await client.get("/ui/mcp")
            run_page = await client.get(f"/ui/runs/{run_id}")
        finally:
            client.cookies.delete(COOKIE_NAME)
        assert ui.status_code == 200 and "remote" in ui.text and "Authorization" in ui.text
        assert "s3cret" not in ui.text
        # The run page says which server, and which version of it, each tool came from.
        assert run_page.status_code == 200 and "MCP server &#39;remote&#39; (counting 1.2.3)" in run_page.text
        server_id = made.json()["data"]["id"]
        assert (await client.delete(f"/v1/mcp-servers/{server_id}", headers=other_headers)).status_code == 404
        assert (await client.delete(f"/v1/mcp-servers/{server_id}", headers=headers)).status_code == 204
    assert ws_id


async def test_a_private_address_is_refused_unless_allowed(harness: Harness, settings: Settings) -> None:
    app = create_app(settings, runtime=harness.rt)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        ws = await client.post("/v1/workspaces", json={"name": "P", "slug": new_id("p").replace("_", "-")})
        key = await client.post("/v1/api-keys", json={"name": "k", "workspaceId": ws.json()["data"]["id"]})
        headers = {"x-api-key": key.json()["data"]["key"]}
        refused = await client.post(
            "/v1/mcp-servers", json={"name": "local", "url": "http://127.0.0.1:9/mcp"}, headers=headers
        )
        assert refused.status_code == 400
        assert refused.json()["error"]["details"]["errors"][0]["path"] == "url"


async def test_a_fork_inherits_its_origins_pinned_list(
    harness: Harness, fake: FakeLLMServer, sdk: SdkProviders, api: Any, with_count: Any, call_log: Path
) -> None:
    client, headers, ws_id = api
    fake.openai.enqueue(
        openai_tool_calls([("c1", "count_add", '{"a": 1, "b": 2}')]),
        openai_tool_calls([("c2", "count_echo", '{"text": "x"}')]),
        openai_text("done"),
    )
    def_id = await create_definition(
        harness.rt, ws_id, {"name": "forked", "version": "1", "steps": [llm_step(tools=[{"mcp": "count"}])]}
    )
    run, _ = await commands.create_run(harness.rt, ws_id, def_id, {"question": "?"})
    row = await harness.wait_for_status(run["id"], "COMPLETED", "FAILED")
    assert row["status"] == "COMPLETED", row["error"]
    # The origin's pin gains a tool the server does not have: only a fork reading it would offer it.
    ghost = {
        "name": "ghost",
        "description": "pinned only",
        "inputSchema": {"type": "object", "properties": {}},
    }
    await harness.rt.pool.execute(
        "UPDATE mcp_tool_pins SET tools = tools || $2::jsonb WHERE workflow_run_id = $1", run["id"], [ghost]
    )
    fake.openai.enqueue(openai_text("forked"))
    forked = await client.post(
        f"/v1/workflow-runs/{run['id']}/fork", json={"at": {"step": "agent", "round": 2}}, headers=headers
    )
    assert forked.status_code == 201, forked.text
    fork_id = forked.json()["data"]["id"]
    row = await harness.wait_for_status(fork_id, "COMPLETED", "FAILED")
    assert row["status"] == "COMPLETED", row["error"]
    assert "count_ghost" in _offered(fake, len(fake.openai.requests) - 1)
    own = await harness.rt.pool.fetchval(
        "SELECT count(*) FROM mcp_tool_pins WHERE workflow_run_id = $1", fork_id
    )
    assert own == 0  # nothing listed again: the origin's list was read


async def test_an_mcp_image_reaches_anthropic_inside_the_tool_result(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders, with_count: Any
) -> None:
    fake.anthropic.enqueue(
        anthropic_tool_use([("toolu_1", "count_pixel", {})]),
        anthropic_text("One pixel."),
    )
    step = llm_step(model="claude-haiku-4-5", tools=[{"mcp": "count", "include": ["pixel"]}])
    result = await run_workflow(harness, workspace_id, step)

    assert result.status == "COMPLETED", result.run["error"]
    (trace,) = result.traces
    _, image = trace["output_json"]["content"]
    stored = await harness.rt.pool.fetchrow(
        "SELECT media_type, data FROM blobs WHERE workspace_id = $1 AND sha256 = $2",
        workspace_id,
        image["sha256"],
    )
    assert stored["media_type"] == "image/png" and bytes(stored["data"]).startswith(b"\x89PNG")
    _, _, results = anthropic_messages(fake, 1)
    (tool_result,) = results["content"]
    assert tool_result["content"][1] == {
        "type": "image",
        "source": {
            "type": "base64",
            "media_type": "image/png",
            "data": base64.b64encode(stored["data"]).decode(),
        },
    }
