"""The per-process MCP client against real servers: the reference time server (PyPI) and
filesystem server (npm) over stdio, and our counting server over stdio and streamable HTTP."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from stevora.mcp.client import McpUnavailable
from stevora.mcp.manager import McpClientManager
from stevora.mcp.results import convert_result
from tests.mcp_servers import (
    counting_http,
    counting_stdio,
    filesystem_server,
    free_port,
    logged_calls,
    time_server,
)

pytestmark = pytest.mark.timeout(120)


async def test_the_reference_time_server_lists_and_answers_over_stdio() -> None:
    manager = McpClientManager({"time": time_server()})
    try:
        conn = manager.connection("time")
        assert conn is not None
        listed = await conn.list_tools()
        assert {t.name for t in listed.tools} >= {"get_current_time", "convert_time"}
        assert listed.server_name == "mcp-time"
        result = convert_result(
            await conn.call_tool("get_current_time", {"timezone": "UTC"}, idempotency_key="k", timeout_s=20)
        )
        assert not result.is_error
        assert result.output["timezone"] == "UTC"  # its structuredContent is the output
        bad = convert_result(
            await conn.call_tool(
                "get_current_time", {"timezone": "Nowhere/Else"}, idempotency_key="k2", timeout_s=20
            )
        )
        assert bad.is_error and "Invalid timezone" in bad.error_text
    finally:
        await manager.close()
    assert manager.health()["time"].state == "closed"


async def test_the_npm_filesystem_server_reads_and_writes_files_over_stdio(tmp_path: Path) -> None:
    (tmp_path / "hello.txt").write_text("hello from a file")
    manager = McpClientManager({"files": filesystem_server(tmp_path)})
    try:
        conn = manager.connection("files")
        assert conn is not None
        listed = await conn.list_tools()
        assert {"read_text_file", "write_file", "list_directory"} <= {t.name for t in listed.tools}
        read = convert_result(
            await conn.call_tool(
                "read_text_file", {"path": str(tmp_path / "hello.txt")}, idempotency_key="r", timeout_s=30
            )
        )
        assert "hello from a file" in str(read.output)
        outside = convert_result(
            await conn.call_tool(
                "read_text_file", {"path": "/etc/hostname"}, idempotency_key="o", timeout_s=30
            )
        )
        assert outside.is_error  # the server's own sandbox: an error result, not an exception
    finally:
        await manager.close()


async def test_a_killed_stdio_server_fails_the_call_in_flight_and_the_next_call_restarts_it(
    tmp_path: Path,
) -> None:
    log = tmp_path / "calls.jsonl"
    manager = McpClientManager({"count": counting_stdio(log)})
    try:
        conn = manager.connection("count")
        assert conn is not None
        pid = convert_result(await conn.call_tool("whoami", {}, idempotency_key="w", timeout_s=20)).output[
            "result"
        ]

        async def kill_soon() -> None:
            await asyncio.sleep(0.5)
            os.kill(pid, signal.SIGKILL)

        killer = asyncio.create_task(kill_soon())
        with pytest.raises(McpUnavailable, match="closed the connection"):
            await conn.call_tool("slow", {"seconds": 10}, idempotency_key="s", timeout_s=30)
        await killer
        assert conn.health.state == "down"
        again = convert_result(
            await conn.call_tool("echo", {"text": "back"}, idempotency_key="e", timeout_s=20)
        )
        assert again.output == {"result": "back"}
        assert conn.health.restarts == 1 and conn.health.state == "up"
        pids = {call["pid"] for call in logged_calls(log)}
        assert len(pids) == 2 and pid in pids  # a new process answered
    finally:
        await manager.close()


async def test_a_server_that_cannot_start_is_unavailable_at_once_and_backs_off(tmp_path: Path) -> None:
    from stevora.mcp.config import McpServerConfig

    manager = McpClientManager(
        {"gone": McpServerConfig(name="gone", command=str(tmp_path / "no-such-binary"))}
    )
    try:
        conn = manager.connection("gone")
        assert conn is not None
        with pytest.raises(McpUnavailable, match="cannot be started"):
            await conn.list_tools()
        with pytest.raises(McpUnavailable):  # the second failure in a row waits for the backoff
            await conn.list_tools()
        with pytest.raises(McpUnavailable, match="next restart in"):
            await conn.list_tools()
    finally:
        await manager.close()


async def test_calls_carry_the_idempotency_key_in_meta_progress_arrives_and_a_timeout_keeps_the_session(
    tmp_path: Path,
) -> None:
    log = tmp_path / "calls.jsonl"
    manager = McpClientManager({"count": counting_stdio(log)})
    progress: list[tuple[float, float | None, str | None]] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append((done, total, message))

    try:
        conn = manager.connection("count")
        assert conn is not None
        await conn.call_tool(
            "slow",
            {"seconds": 0.2, "steps": 2},
            idempotency_key="srun_1:1:0",
            timeout_s=20,
            progress=on_progress,
        )
        assert progress == [(1, 2, "step 1 of 2"), (2, 2, "step 2 of 2")]
        with pytest.raises(TimeoutError):
            await conn.call_tool("slow", {"seconds": 5}, idempotency_key="t", timeout_s=0.3)
        echo = await conn.call_tool("echo", {"text": "still here"}, idempotency_key="e", timeout_s=20)
        assert convert_result(echo).output == {"result": "still here"}
        assert conn.health.restarts == 0
        assert [c["idempotencyKey"] for c in logged_calls(log)] == ["srun_1:1:0", "t", "e"]
    finally:
        await manager.close()


async def test_an_image_result_is_stored_once_by_hash_not_inlined(tmp_path: Path) -> None:
    manager = McpClientManager({"count": counting_stdio(tmp_path / "calls.jsonl")})
    try:
        conn = manager.connection("count")
        assert conn is not None
        result = convert_result(await conn.call_tool("pixel", {}, idempotency_key="p", timeout_s=20))
        (blob,) = result.blobs
        text, image = result.output["content"]
        assert text == {"type": "text", "text": "a pixel"}
        assert image == {
            "type": "image",
            "mimeType": "image/png",
            "bytes": len(blob.data),
            "sha256": blob.sha256,
        }
        assert blob.data.startswith(b"\x89PNG")
    finally:
        await manager.close()


async def test_an_http_session_the_server_dropped_is_initialised_again(tmp_path: Path) -> None:
    from stevora.mcp.config import McpServerConfig

    log = tmp_path / "calls.jsonl"
    port = free_port()
    config = McpServerConfig(name="remote", url=f"http://127.0.0.1:{port}/mcp", headers={"X-Secret": "s"})
    manager = McpClientManager()
    try:
        conn = manager.connection("remote", workspace_id="ws_1", registered=config)
        assert conn is not None
        assert (
            manager.connection("remote", workspace_id="ws_2", registered=config) is not conn
        )  # per workspace
        with counting_http(log, port):
            first = await conn.call_tool("add", {"a": 2, "b": 3}, idempotency_key="a", timeout_s=20)
            assert convert_result(first).output == {"sum": 5}
        with pytest.raises(McpUnavailable):  # the server is gone: this call fails at once
            await conn.call_tool("add", {"a": 1, "b": 1}, idempotency_key="b", timeout_s=20)
        with counting_http(log, port):  # back, with none of the old sessions
            again = await conn.call_tool("add", {"a": 4, "b": 4}, idempotency_key="c", timeout_s=20)
            assert convert_result(again).output == {"sum": 8}
        assert [c["idempotencyKey"] for c in logged_calls(log)] == ["a", "c"]
    finally:
        await manager.close()


async def test_a_registered_server_is_checked_by_the_url_guard_before_each_session() -> None:
    from stevora.mcp.config import McpServerConfig
    from stevora.webhooks.address import BlockedUrl, check_webhook_url

    manager = McpClientManager()
    checked: list[str] = []

    async def guard(url: str) -> None:
        checked.append(url)
        await check_webhook_url(url, allow_private=False)

    manager.url_guard = guard
    config = McpServerConfig(name="inside", url="http://127.0.0.1:9/mcp")
    try:
        conn = manager.connection("inside", workspace_id="ws_1", registered=config)
        assert conn is not None
        with pytest.raises(McpUnavailable, match="cannot be started") as caught:
            await conn.list_tools()
        assert isinstance(caught.value.__cause__, BlockedUrl)
        assert checked == ["http://127.0.0.1:9/mcp"]
    finally:
        await manager.close()
