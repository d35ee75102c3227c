"""Streaming as deployed: `stevora worker` calls the fake OpenAI API through the SDK, publishes the
answer's text with pg_notify, and `stevora api` (another process) sends it live on the run's event
stream while the call is still in flight; the Python client's stream yields only stored events."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from pathlib import Path
from typing import Any

import httpx

from stevora.client import AsyncAgentRuntime
from stevora.testing.fake_llm import FakeLLMServer, openai_text
from stevora.testing.fake_stream import StreamDefaults
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

ANSWER = "Streaming works across processes: worker to PostgreSQL to the API to you."
FIRST_TOKEN_S, CHUNK_DELAY_S, CHUNKS = 1.0, 0.3, 6


async def _follow(url: str, key: str, run_id: str) -> list[tuple[float, str, dict[str, Any], bool]]:
    """(arrival time, event name, data, has an id) of every SSE message until the stream ends."""
    out: list[tuple[float, str, dict[str, Any], bool]] = []
    headers = {"x-api-key": key, "accept": "text/event-stream"}
    async with (
        httpx.AsyncClient(timeout=60) as http,
        http.stream("GET", f"{url}/v1/workflow-runs/{run_id}/events/stream", headers=headers) as response,
    ):
        assert response.status_code == 200
        fields: dict[str, str] = {}
        async for line in response.aiter_lines():
            if line:
                name, _, value = line.partition(": ")
                fields[name] = value
                continue
            if "data" in fields:
                out.append(
                    (time.monotonic(), fields.get("event", ""), json.loads(fields["data"]), "id" in fields)
                )
            fields = {}
    return out


async def test_text_deltas_cross_from_the_worker_process_to_the_api_stream_while_the_call_runs(
    fresh_database_url: str, tmp_path: Path
) -> None:
    timing = StreamDefaults(first_token_s=FIRST_TOKEN_S, chunk_delay_s=CHUNK_DELAY_S, chunks=CHUNKS)
    with FakeLLMServer(stream=timing) as fake:
        fake.openai.enqueue(openai_text(ANSWER, usage={"prompt_tokens": 12, "completion_tokens": 9}))
        env = _env(
            STEVORA_DATABASE_URL=fresh_database_url,
            STEVORA_BROKER_URL=require_broker("rabbitmq"),
            STEVORA_QUEUE_NAME=f"stream-{secrets.token_hex(4)}",
            OPENAI_API_KEY="test",
            OPENAI_BASE_URL=fake.openai_base_url,
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
                workspace = await anonymous.workspaces.create("Stream test", f"stream-{secrets.token_hex(3)}")
                key = await anonymous.api_keys.create("first", workspace_id=workspace.id)
            async with AsyncAgentRuntime(key.key, base_url=url) as client:
                spec = {
                    "name": "streamed",
                    "version": "1",
                    "steps": [{"type": "llm", "name": "say", "model": "gpt-4o-mini",
                               "messages": [{"role": "user", "content": "Say it."}]}],
                }  # fmt: skip
                definition = await client.definitions.apply(spec)
                run = await client.workflows.create(definition.id, {})
                raw, stored = await asyncio.gather(
                    _follow(url, key.key, run.id), _collect(client.workflows.stream(run.id))
                )
                calls = await client.workflows.llm_calls(run.id)
        finally:
            assert _stop(worker) in CLEAN_EXIT, worker_log.read_text()[-3000:]
            _stop(api)

    deltas = [(at, data) for at, name, data, has_id in raw if name == "llm.text.delta"]
    assert all(not has_id for _, name, _, has_id in raw if name == "llm.text.delta")
    [completed_at] = [at for at, name, _, _ in raw if name == "LLM_CALL_COMPLETED"]
    assert len(deltas) >= 3, raw
    assert "".join(d["text"] for _, d in sorted(deltas, key=lambda x: x[1]["offset"])) == ANSWER
    # Live, not batched at the end: the first piece came well before the call was recorded.
    assert completed_at - deltas[0][0] >= (CHUNKS - 2) * CHUNK_DELAY_S * 0.8
    assert all(at <= completed_at for at, _ in deltas)
    # The client yields stored events only, in sequence, through to the run's end.
    assert [e.sequence for e in stored] == list(range(1, len(stored) + 1))
    assert stored[-1].event_type == "WORKFLOW_COMPLETED"
    [call] = calls
    assert call.time_to_first_token_ms is not None
    assert FIRST_TOKEN_S * 1000 <= call.time_to_first_token_ms < FIRST_TOKEN_S * 1000 + 1500
    assert (call.input_tokens, call.output_tokens) == (12, 9)


async def _collect(stream: Any) -> list[Any]:
    return [event async for event in stream]
