"""MCP tools at the edges of the loop: budgets count MCP calls, a `tool` step calls an MCP tool
(the npm filesystem server), hostile arguments never reach a server, and a long call's progress
reaches the live channel (docs/mcp.md)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from stevora.db.database import asyncpg_dsn
from stevora.engine import commands
from stevora.events import LLM_TEXT_CHANNEL, TOOL_PROGRESS
from stevora.mcp.manager import McpClientManager
from stevora.testing.fake_llm import FakeLLMServer, openai_text, openai_tool_calls
from tests.conftest import Harness, create_definition
from tests.integration.loop.conftest import SdkProviders, llm_step, load_run, run_workflow
from tests.mcp_servers import counting_stdio, filesystem_server, logged_calls

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def call_log(tmp_path: Path) -> Path:
    return tmp_path / "calls.jsonl"


@pytest.fixture
async def with_servers(harness: Harness, call_log: Path, tmp_path: Path) -> AsyncIterator[Path]:
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "notes.txt").write_text("the notes")
    manager = McpClientManager({"count": counting_stdio(call_log), "files": filesystem_server(shared)})
    harness.rt.mcp = manager
    yield shared
    await manager.close()


async def test_a_budget_counts_mcp_calls(
    harness: Harness,
    workspace_id: str,
    fake: FakeLLMServer,
    sdk: SdkProviders,
    with_servers: Path,
    call_log: Path,
) -> None:
    fake.openai.responder = lambda body: openai_tool_calls(
        [(f"c{len(body['messages'])}", "count_echo", '{"text": "again"}')]
    )
    spec = {
        "name": "runaway",
        "version": "1",
        "budget": {"maxToolCalls": 3},
        "steps": [llm_step(tools=[{"mcp": "count"}])],
    }
    def_id = await create_definition(harness.rt, workspace_id, spec)
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id, {"question": "go"})
    row = await harness.wait_for_status(run["id"], "COMPLETED", "FAILED", timeout_s=60)
    assert row["status"] == "FAILED" and row["error"]["code"] == "BUDGET_EXCEEDED", row["error"]
    assert row["error"]["details"]["limit"] == "maxToolCalls"
    assert len(logged_calls(call_log)) == 3  # the fourth call was refused before reaching the server


async def test_a_tool_step_calls_an_mcp_tool_of_the_npm_filesystem_server(
    harness: Harness, workspace_id: str, with_servers: Path
) -> None:
    steps = [
        {"type": "tool", "name": "read", "tool": "files_read_text_file", "input": {"path": "{{input.path}}"}}
    ]
    def_id = await create_definition(
        harness.rt, workspace_id, {"name": "reader", "version": "1", "steps": steps}
    )
    run, _ = await commands.create_run(
        harness.rt, workspace_id, def_id, {"path": str(with_servers / "notes.txt")}
    )
    row = await harness.wait_for_status(run["id"], "COMPLETED", "FAILED", timeout_s=60)
    assert row["status"] == "COMPLETED", row["error"]
    result = await load_run(harness, run["id"])
    (trace,) = result.traces
    assert trace["tool_name"] == "files_read_text_file" and trace["status"] == "completed"
    assert "the notes" in json.dumps(trace["output_json"])
    assert trace["idempotency_key"].endswith(":tool")


@pytest.mark.parametrize(
    "arguments",
    [
        '{"text": 12}',
        "not json at all",
        '["a", "list"]',
        '{"text": "x", "extra": ' + "[" * 100 + "]" * 100 + "}",
    ],
)
async def test_hostile_arguments_to_an_mcp_tool_never_reach_the_server(
    harness: Harness,
    workspace_id: str,
    fake: FakeLLMServer,
    sdk: SdkProviders,
    with_servers: Path,
    call_log: Path,
    arguments: str,
) -> None:
    fake.openai.enqueue(openai_tool_calls([("c1", "count_echo", arguments)]), openai_text("ok"))
    result = await run_workflow(
        harness, workspace_id, llm_step(tools=[{"mcp": "count", "include": ["echo"]}])
    )
    assert result.status == "COMPLETED", result.run["error"]
    (trace,) = result.traces
    assert (trace["status"], trace["error_code"]) == ("failed", "INVALID_ARGUMENTS")
    assert logged_calls(call_log) == []


async def test_a_long_calls_progress_reaches_the_live_channel(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders, with_servers: Path
) -> None:
    import asyncpg

    heard: list[dict[str, Any]] = []
    listener = await asyncpg.connect(asyncpg_dsn(harness.rt.settings.database_url))
    await listener.add_listener(LLM_TEXT_CHANNEL, lambda *args: heard.append(json.loads(args[3])))
    try:
        fake.openai.enqueue(
            openai_tool_calls([("c1", "count_slow", '{"seconds": 0.4, "steps": 2}')]), openai_text("ok")
        )
        result = await run_workflow(harness, workspace_id, llm_step(tools=[{"mcp": "count"}]))
        assert result.status == "COMPLETED", result.run["error"]
        for _ in range(100):
            if len(heard) >= 2:
                break
            await asyncio.sleep(0.05)
    finally:
        await listener.close()
    progress = [h for h in heard if h.get("event") == TOOL_PROGRESS and h["runId"] == result.id]
    assert [(p["progress"], p["total"], p["message"]) for p in progress] == [
        (1, 2, "step 1 of 2"),
        (2, 2, "step 2 of 2"),
    ]
    assert all(p["toolName"] == "count_slow" and p["toolCallId"] == "c1" for p in progress)
