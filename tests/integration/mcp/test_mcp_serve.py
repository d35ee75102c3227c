"""`stevora mcp serve`, tested with the `mcp` SDK's own client over stdio (and streamable HTTP):
the definitions are its tools, a call starts a durable run and returns its output, progress
arrives as notifications, and a run that waits for a person says so (docs/mcp.md)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from stevora.api.app import create_app
from stevora.settings import Settings
from stevora.tasks import StepResult
from tests.conftest import Harness, create_definition
from tests.integration.client.live_server import insert_api_key, serve
from tests.mcp_servers import ROOT, free_port

pytestmark = pytest.mark.timeout(120)

GREETER = {
    "name": "greet.user",
    "version": "1",
    "description": "Greets someone, durably",
    "inputSchema": {"type": "object", "properties": {"who": {"type": "string"}}, "required": ["who"]},
    "steps": [
        {"type": "task", "name": "first", "handler": "greet"},
        {"type": "task", "name": "second", "handler": "greet"},
    ],
}
NEEDS_APPROVAL = {
    "name": "needs-approval",
    "version": "1",
    "defaultParams": "amount=10",
    "steps": [
        {"type": "task", "name": "stash", "handler": "stash"},
        {"type": "approval", "name": "check", "contentKey": "amount"},
    ],
}


@pytest.fixture
async def api(harness: Harness, settings: Settings, workspace_id: str) -> AsyncIterator[tuple[str, str]]:
    async def greet(ctx: Any) -> StepResult:
        await asyncio.sleep(0.5)
        greeting = f"hello {ctx.workflow_input['who']}"
        return StepResult(output={"greeting": greeting}, state_updates={"greeting": greeting})

    harness.tasks.register("greet", greet)
    harness.tasks.register(
        "stash", lambda ctx: StepResult(output={}, state_updates={"amount": ctx.workflow_input["amount"]})
    )
    await create_definition(harness.rt, workspace_id, GREETER)
    await create_definition(harness.rt, workspace_id, NEEDS_APPROVAL)
    key = await insert_api_key(harness.rt, workspace_id)
    async with serve(create_app(settings, runtime=harness.rt)) as url:
        yield url, key


def _env(url: str, key: str) -> dict[str, str]:
    return {**os.environ, "STEVORA_URL": url, "STEVORA_API_KEY": key, "PYTHONPATH": str(ROOT)}


async def test_definitions_are_tools_and_a_call_returns_the_runs_output_over_stdio(
    api: tuple[str, str],
) -> None:
    url, key = api
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "stevora.cli", "mcp", "serve", "--definitions", "greet.user,needs-approval"],
        env=_env(url, key),
        cwd=str(ROOT),
    )
    progress: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress_: float, total: float | None, message: str | None) -> None:
        progress.append((progress_, total, message))

    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        init = await session.initialize()
        assert init.server_info.name == "stevora"
        tools = {t.name: t for t in (await session.list_tools()).tools}
        assert set(tools) == {"greet_user", "needs-approval"}  # '.' cannot be in a tool name
        assert tools["greet_user"].input_schema["required"] == ["who"]
        assert tools["needs-approval"].input_schema["properties"]["amount"]["default"] == 10

        result = await session.call_tool("greet_user", {"who": "Ada"}, progress_callback=on_progress)
        assert not result.is_error, result.content
        assert result.structured_content is not None
        assert result.structured_content["status"] == "COMPLETED"
        assert result.structured_content["output"]["greeting"] == "hello Ada"
        assert "hello Ada" in result.content[0].text  # type: ignore[union-attr]
        assert any("step" in (m or "") for _, _, m in progress)

        waiting = await session.call_tool("needs-approval", {"amount": 5})
        assert not waiting.is_error
        assert waiting.structured_content is not None and waiting.structured_content["status"] == "WAITING"
        assert "approval" in waiting.content[0].text  # type: ignore[union-attr]


async def test_serve_over_streamable_http(api: tuple[str, str]) -> None:
    url, key = api
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        *[
            sys.executable,
            "-m",
            "stevora.cli",
            "mcp",
            "serve",
            "--definitions",
            "greet.user",
            "--transport",
            "http",
            "--port",
            str(port),
        ],
        env=_env(url, key),
        cwd=ROOT,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        for _ in range(300):
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                await writer.wait_closed()
                break
            except OSError:
                await asyncio.sleep(0.1)
        async with (
            streamable_http_client(f"http://127.0.0.1:{port}/mcp") as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            result = await session.call_tool("greet_user", {"who": "Grace"})
            assert result.structured_content is not None
            assert result.structured_content["output"]["greeting"] == "hello Grace"
    finally:
        proc.kill()
        await proc.wait()


async def test_mcp_list_shows_the_workers_servers_and_their_health(
    harness: Harness, settings: Settings, workspace_id: str
) -> None:
    from typer.testing import CliRunner

    from stevora.cli import app
    from stevora.db import mcp as db_mcp

    await db_mcp.publish_worker_servers(
        harness.rt.pool,
        "w-1",
        [("files", "stdio", "down", 2, "Connection closed", "secure-filesystem-server 0.2.0")],
    )
    key = await insert_api_key(harness.rt, workspace_id)
    async with serve(create_app(settings, runtime=harness.rt)) as url:
        env = {"STEVORA_URL": url, "STEVORA_API_KEY": key, "STEVORA_API_KEY_FILE": ""}
        import stevora.cli.mcp_commands  # noqa: F401  (registers `stevora mcp`)

        shown = await asyncio.to_thread(CliRunner().invoke, app, ["mcp", "list"], env=env)
        as_json = await asyncio.to_thread(CliRunner().invoke, app, ["mcp", "list", "--json"], env=env)
    assert shown.exit_code == 0, shown.output
    assert "files" in shown.output and "down" in shown.output and "Connection closed" in shown.output
    (worker,) = [w for w in json.loads(as_json.output)["workers"] if w["workerId"] == "w-1"]
    assert (worker["state"], worker["restarts"]) == ("down", 2)
