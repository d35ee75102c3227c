"""Streamed model calls end to end: runs through the API whose `llm` step calls the real OpenAI and
Anthropic SDKs against the fake's SSE streams (real timing). The run's event stream carries the
text live (id-less `llm.text.delta` messages, before the call's stored `LLM_CALL_COMPLETED`);
the stored rows equal those of the same run not streamed, plus the time to first token; a stream
that breaks mid-way is recorded as a failed call and the fallback model answers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import openai
import pytest
from api_helpers import DefinitionFactory, Tenant
from fastapi import FastAPI
from test_api_events import parse_sse

from stevora.llm.anthropic_provider import AnthropicProvider
from stevora.llm.openai_provider import OpenAIProvider
from stevora.testing.fake_llm import (
    FakeLLMServer,
    FakeResponse,
    anthropic_text,
    anthropic_tool_use,
    openai_text,
    openai_tool_calls,
)
from stevora.testing.fake_stream import StreamDefaults, streamed

FIRST_TOKEN_S = 0.3
TEXT = "Refunds are possible within thirty days; the article explains how to ask for one."
TOOL = {
    "name": "search_kb",
    "description": "Search the knowledge base",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
}
# Differ per run: ids, times, and what only a streamed call has.
VOLATILE = {"id", "workflow_run_id", "step_run_id", "created_at", "duration_ms", "time_to_first_token_ms"}


@pytest.fixture
def fake() -> Iterator[FakeLLMServer]:
    timing = StreamDefaults(first_token_s=FIRST_TOKEN_S, chunk_delay_s=0.06, chunks=5)
    with FakeLLMServer(stream=timing) as server:
        yield server


@dataclass
class Streaming:
    client: httpx.AsyncClient
    tenant: Tenant
    define: DefinitionFactory
    harness: Any
    fake: FakeLLMServer
    providers: dict[str, Any]


@pytest.fixture
async def env(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: Tenant,
    define: DefinitionFactory,
    harness: Any,
    fake: FakeLLMServer,
) -> AsyncIterator[Streaming]:
    """SDK providers on the streaming fake, the API polling fast, the LISTEN connection up."""
    app.state.ctx.sse_poll_s = 0.05
    oai = openai.AsyncOpenAI(
        api_key="test", base_url=fake.openai_base_url, max_retries=2, _strict_response_validation=True
    )
    ant = anthropic.AsyncAnthropic(
        api_key="test",
        base_url=fake.anthropic_base_url,
        max_retries=2,
        open_telemetry=False,
        _strict_response_validation=True,
    )
    registered = {
        "openai": OpenAIProvider("test", client=oai),
        "anthropic": AnthropicProvider("test", client=ant),
    }
    for name, provider in registered.items():
        harness.rt.providers.register(name, provider)
    harness.tools.register("search_kb", lambda input: [f"article about {input['query']}"])
    # The API's one LISTEN connection is up before the run starts (a stream opened later would
    # rightly miss the deltas published before it).
    async with harness.rt.live.subscribe("warm-up"):
        pass
    yield Streaming(client, tenant, define, harness, fake, registered)
    await oai.close()
    await ant.close()


def _answers(kind: str) -> tuple[FakeResponse, FakeResponse]:
    if kind == "openai":
        return (
            openai_tool_calls(
                [("call_1", "search_kb", '{"query": "refund policy"}')], usage={"prompt_tokens": 40}
            ),
            openai_text(TEXT, usage={"prompt_tokens": 90, "completion_tokens": 21}),
        )
    return (
        anthropic_tool_use(
            [("toolu_1", "search_kb", {"query": "refund policy"})], usage={"input_tokens": 40}
        ),
        anthropic_text(TEXT, usage={"input_tokens": 90, "output_tokens": 21}),
    )


async def _run_and_stream(
    client: httpx.AsyncClient, tenant: Tenant, definition_id: str, harness: Any
) -> tuple[str, list[dict[str, Any]]]:
    """Start a run, follow its SSE stream from the first event to the end; (run id, messages)."""
    created = await client.post(
        "/v1/workflow-runs", json={"definitionId": definition_id}, headers=tenant.headers
    )
    assert created.status_code == 201, created.text
    run_id: str = created.json()["data"]["id"]
    stream = asyncio.create_task(
        client.get(f"/v1/workflow-runs/{run_id}/events/stream", headers=tenant.headers)
    )
    await harness.wait_for_status(run_id, "COMPLETED", "FAILED", timeout_s=30)
    response = await asyncio.wait_for(stream, 30)
    assert response.status_code == 200
    messages, _ = parse_sse(response.text)
    return run_id, messages


async def _llm_calls(client: httpx.AsyncClient, tenant: Tenant, run_id: str) -> list[dict[str, Any]]:
    response = await client.get(f"/v1/workflow-runs/{run_id}/llm-calls", headers=tenant.headers)
    assert response.status_code == 200, response.text
    calls: list[dict[str, Any]] = response.json()["data"]
    return calls


@pytest.mark.parametrize(("kind", "model"), [("openai", "gpt-4o-mini"), ("anthropic", "claude-haiku-4-5")])
async def test_text_streams_live_on_the_run_stream_and_the_stored_rows_match_an_unstreamed_run(
    kind: str, model: str, env: Streaming
) -> None:
    client, tenant, define, harness, fake = env.client, env.tenant, env.define, env.harness, env.fake
    step = {
        "type": "llm",
        "name": "answer",
        "model": model,
        "messages": [{"role": "user", "content": "Refund?"}],
    }
    definition_id = await define([{**step, "tools": [TOOL]}])
    answers = _answers(kind)
    fake.enqueue(*answers)
    run_id, messages = await _run_and_stream(client, tenant, definition_id, harness)

    deltas = [m for m in messages if m["event"] == "llm.text.delta"]
    completed = [i for i, m in enumerate(messages) if m["event"] == "LLM_CALL_COMPLETED"]
    assert len(completed) == 2 and messages[-1]["event"] == "WORKFLOW_COMPLETED"
    assert all("id" not in m for m in deltas)  # Last-Event-ID resume stays about stored events
    assert all("id" in m for m in messages if m["event"] != "llm.text.delta")
    # Every delta arrived while the text round was in flight: after the tool round, before its end.
    positions = [i for i, m in enumerate(messages) if m["event"] == "llm.text.delta"]
    assert len(deltas) >= 2 and completed[0] < positions[0] and positions[-1] < completed[1]
    text_round = messages[completed[1]]["data"]["payload"]["round"]
    assert {
        (d["data"]["runId"], d["data"]["round"], d["data"]["model"], d["data"]["provider"]) for d in deltas
    } == {(run_id, text_round, model, kind)}
    ordered = sorted((d["data"] for d in deltas), key=lambda d: d["offset"])
    assert [d["offset"] for d in ordered] == [
        sum(len(p["text"]) for p in ordered[:i]) for i in range(len(ordered))
    ]
    assert "".join(d["text"] for d in ordered) == TEXT

    calls = await _llm_calls(client, tenant, run_id)
    assert [c["status"] for c in calls] == ["completed", "completed"]
    assert calls[0]["response"]["toolCalls"] == [
        {
            "id": calls[0]["response"]["toolCalls"][0]["id"],
            "name": "search_kb",
            "arguments": '{"query": "refund policy"}',
        }
        if kind == "openai"
        else {"id": "toolu_1", "name": "search_kb", "arguments": '{"query":"refund policy"}'}
    ]
    assert calls[1]["response"]["text"] == TEXT
    payloads = [messages[i]["data"]["payload"] for i in completed]
    for call, payload in zip(calls, payloads, strict=True):
        ttft = call["timeToFirstTokenMs"]
        assert FIRST_TOKEN_S * 1000 <= ttft < FIRST_TOKEN_S * 1000 + 700, ttft
        assert ttft < call["durationMs"]
        assert payload["timeToFirstTokenMs"] == pytest.approx(ttft, abs=0.001)

    # The same run with streaming off: the same rows, field for field, except the volatile ones.
    for provider in env.providers.values():
        provider.stream = False
    fake.enqueue(*answers)
    plain_id, plain_messages = await _run_and_stream(client, tenant, definition_id, harness)
    assert not [m for m in plain_messages if m["event"] == "llm.text.delta"]
    plain_calls = await _llm_calls(client, tenant, plain_id)
    assert [c["timeToFirstTokenMs"] for c in plain_calls] == [None, None]
    camel_volatile = {"id", "workflowRunId", "stepRunId", "createdAt", "durationMs", "timeToFirstTokenMs"}
    assert [{k: v for k, v in c.items() if k not in camel_volatile} for c in calls] == [
        {k: v for k, v in c.items() if k not in camel_volatile} for c in plain_calls
    ]
    assert sum(c["costUsd"] for c in calls) > 0
    rows = await harness.rt.pool.fetch(
        "SELECT * FROM llm_calls WHERE workflow_run_id = ANY($1::text[]) ORDER BY workflow_run_id = $2, round",
        [run_id, plain_id],
        run_id,
    )
    streamed_rows, plain_rows = rows[2:], rows[:2]
    assert [{k: v for k, v in dict(r).items() if k not in VOLATILE} for r in streamed_rows] == [
        {k: v for k, v in dict(r).items() if k not in VOLATILE} for r in plain_rows
    ]


@pytest.mark.parametrize("fault", ["error_after", "drop_after"])
async def test_a_stream_broken_mid_answer_is_a_failed_call_and_the_fallback_model_answers(
    fault: str, env: Streaming
) -> None:
    client, tenant, define, harness, fake = env.client, env.tenant, env.define, env.harness, env.fake
    definition_id = await define(
        [
            {
                "type": "llm",
                "name": "answer",
                "model": "gpt-4o-mini",
                "fallbackModels": ["claude-haiku-4-5"],
                "messages": [{"role": "user", "content": "Refund?"}],
                "retry": {"maxAttempts": 1},
            }
        ]
    )
    fake.openai.enqueue(streamed(openai_text("This answer never finishes"), **{fault: 2}))
    fake.anthropic.enqueue(anthropic_text(TEXT))
    run_id, messages = await _run_and_stream(client, tenant, definition_id, harness)

    assert messages[-1]["event"] == "WORKFLOW_COMPLETED"
    calls = await _llm_calls(client, tenant, run_id)
    assert [(c["provider"], c["status"]) for c in calls] == [("openai", "failed"), ("anthropic", "completed")]
    failed, answered = calls
    assert failed["error"]["retryable"] is True and "stream broke" in failed["error"]["message"]
    assert failed["timeToFirstTokenMs"] >= FIRST_TOKEN_S * 1000  # it did begin to answer
    assert answered["response"]["text"] == TEXT
    assert len(fake.openai.requests) == 1  # SDK retries (max_retries=2) do not resend a begun stream
    kinds = [m["event"] for m in messages]
    assert kinds.index("LLM_CALL_FAILED") < kinds.index("LLM_CALL_COMPLETED")
    # The broken answer's text went out live too, before its failure was recorded.
    broken = [
        m["data"]["text"]
        for m in messages[: kinds.index("LLM_CALL_FAILED")]
        if m["event"] == "llm.text.delta"
    ]
    assert "This answer never finishes".startswith("".join(broken)) and broken
