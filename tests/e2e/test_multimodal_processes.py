"""Structured outputs and images on real processes (`stevora api` + `stevora worker`) and real
brokers, the providers faked behind the real SDKs: a step with an outputSchema sends strict
json_schema and its answer lands validated; a tool's image reaches Anthropic inside its
tool_result, stored once in `blobs` and named by hash in the trace."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import secrets
from pathlib import Path

import asyncpg
import pytest

from stevora.client import AsyncAgentRuntime
from stevora.testing.fake_llm import FakeLLMServer, anthropic_text, anthropic_tool_use, openai_text
from tests.e2e.attachment_tools import PIXEL
from tests.e2e.conftest import require_broker
from tests.e2e.test_cli_processes import (
    CLEAN_EXIT,
    ROOT,
    STEVORA,
    _env,
    _free_port,
    _start,
    _stop,
    _wait_healthy,
    fresh_database_url,
)

__all__ = ["fresh_database_url"]

pytestmark = pytest.mark.timeout(240)

SCHEMA = {
    "type": "object",
    "properties": {"verdict": {"type": "string", "enum": ["ok", "broken"]}, "notes": {"type": "string"}},
    "required": ["verdict", "notes"],
}


@pytest.mark.parametrize("broker", ["rabbitmq", "redis"])
async def test_structured_output_and_a_tool_image_on_a_real_worker(
    fresh_database_url: str, tmp_path: Path, broker: str
) -> None:
    with FakeLLMServer() as fake:
        fake.anthropic.enqueue(
            anthropic_tool_use([("toolu_1", "screenshot", {"url": "https://example.test"})]),
            anthropic_text("A single pixel."),
        )
        fake.openai.enqueue(openai_text(json.dumps({"verdict": "ok", "notes": "renders"})))
        env = _env(
            STEVORA_DATABASE_URL=fresh_database_url,
            STEVORA_BROKER_URL=require_broker(broker),
            STEVORA_QUEUE_NAME=f"mm-{secrets.token_hex(4)}",
            OPENAI_API_KEY="test",
            OPENAI_BASE_URL=fake.openai_base_url,
            ANTHROPIC_API_KEY="test",
            ANTHROPIC_BASE_URL=fake.anthropic_base_url,
            STEVORA_TOOL_MODULES=json.dumps(["tests.e2e.attachment_tools"]),
        )
        migrate = await asyncio.create_subprocess_exec(*STEVORA, "migrate", cwd=ROOT, env=env)
        assert await asyncio.wait_for(migrate.wait(), 120) == 0
        port = _free_port()
        api_log, worker_log = tmp_path / "api.log", tmp_path / "worker.log"
        api = _start(["api", "--port", str(port)], env, api_log)
        worker = _start(["worker", "--processes", "1", "--threads", "2"], env, worker_log)
        url = f"http://127.0.0.1:{port}"
        try:
            await _wait_healthy(url, api, api_log)
            async with AsyncAgentRuntime(base_url=url) as anonymous:
                workspace = await anonymous.workspaces.create("MM", f"mm-{secrets.token_hex(3)}")
                key = await anonymous.api_keys.create("first", workspace_id=workspace.id)
            async with AsyncAgentRuntime(key.key, base_url=url) as client:
                spec = {
                    "name": "look-then-judge", "version": "1",
                    "steps": [
                        {"type": "llm", "name": "look", "model": "claude-haiku-4-5",
                         "messages": [{"role": "user", "content": "Look at the page."}],
                         "tools": ["screenshot"]},
                        {"type": "llm", "name": "judge", "model": "gpt-4o-mini",
                         "messages": [{"role": "user", "content": "Judge: {{state.look}}"}],
                         "outputSchema": SCHEMA},
                    ],
                }  # fmt: skip
                definition = await client.definitions.apply(spec)
                run = await client.workflows.create(definition.id, {})
                done = await client.workflows.wait_for_completion(run.id, timeout=120, poll_interval=0.2)
                traces = await client.workflows.tool_traces(run.id)
        finally:
            assert _stop(worker) in CLEAN_EXIT, worker_log.read_text()[-3000:]
            _stop(api)

        assert done.status == "COMPLETED", done.error
        assert done.state["judge"] == {"verdict": "ok", "notes": "renders"}
        judge = fake.openai.requests[0].json
        assert judge["response_format"]["type"] == "json_schema"
        assert judge["response_format"]["json_schema"]["strict"] is True
        _, _, results = fake.anthropic.requests[1].json["messages"]
        image = results["content"][0]["content"][1]
        assert image == {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(PIXEL).decode()},
        }
        digest = hashlib.sha256(PIXEL).hexdigest()
        (trace,) = traces
        assert trace.output_json[1]["sha256"] == digest
        conn = await asyncpg.connect(fresh_database_url.replace("+asyncpg", ""))
        try:
            rows = await conn.fetch("SELECT workspace_id, size_bytes FROM blobs WHERE sha256 = $1", digest)
        finally:
            await conn.close()
        assert [(r["workspace_id"], r["size_bytes"]) for r in rows] == [(workspace.id, len(PIXEL))]
