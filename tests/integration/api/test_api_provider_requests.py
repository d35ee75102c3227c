"""Runs whose `llm` steps call the real OpenAI and Anthropic SDKs against the loopback fake:
the step's sampling settings reach the provider request, and no provider key or webhook secret
ever shows up in a log line or an API response."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from api_helpers import DefinitionFactory, Tenant
from test_api_webhooks import Receiver

from stevora.llm.anthropic_provider import AnthropicProvider
from stevora.llm.openai_provider import OpenAIProvider
from stevora.settings import Settings
from stevora.testing.fake_llm import FakeLLMServer, anthropic_text, error, openai_text
from stevora.webhooks import deliver_due

OPENAI_KEY = "sk-test-leakcheck-openai-5f2c9a7e1b"
ANTHROPIC_KEY = "sk-ant-test-leakcheck-anthropic-8d3e"


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"webhook_allow_private": True})


@pytest.fixture
def fake() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as server:
        yield server


@pytest.fixture
async def providers(harness: Any, fake: FakeLLMServer) -> AsyncIterator[None]:
    openai_provider = OpenAIProvider(OPENAI_KEY, fake.openai_base_url, max_retries=0, timeout_s=10)
    anthropic_provider = AnthropicProvider(
        ANTHROPIC_KEY, fake.anthropic_base_url, max_retries=0, timeout_s=10
    )
    harness.rt.providers.register("openai", openai_provider)
    harness.rt.providers.register("anthropic", anthropic_provider)
    yield
    await openai_provider.aclose()
    await anthropic_provider.aclose()


def _llm_step(model: str, **extra: Any) -> dict[str, Any]:
    return {
        "type": "llm",
        "name": "answer",
        "model": model,
        "messages": [{"role": "user", "content": "Say hi"}],
        **extra,
    }


async def _run(client: httpx.AsyncClient, tenant: Tenant, definition_id: str, harness: Any) -> str:
    created = await client.post(
        "/v1/workflow-runs", json={"definitionId": definition_id}, headers=tenant.headers
    )
    assert created.status_code == 201, created.text
    run_id: str = created.json()["data"]["id"]
    await harness.wait_for_status(run_id, "COMPLETED", "FAILED")
    return run_id


@pytest.mark.parametrize(
    ("model", "answer", "max_tokens_field"),
    [
        ("gpt-4o-mini", openai_text("hi"), "max_completion_tokens"),
        ("claude-3-5-haiku-latest", anthropic_text("hi"), "max_tokens"),
    ],
)
async def test_temperature_and_max_tokens_reach_the_provider_request(
    client: httpx.AsyncClient,
    tenant: Tenant,
    define: DefinitionFactory,
    harness: Any,
    fake: FakeLLMServer,
    providers: None,
    model: str,
    answer: Any,
    max_tokens_field: str,
) -> None:
    fake.enqueue(answer)
    definition_id = await define([_llm_step(model, temperature=0.35, maxTokens=77)])
    run_id = await _run(client, tenant, definition_id, harness)
    assert (await harness.wait_for_status(run_id, "COMPLETED"))["status"] == "COMPLETED"
    (request,) = fake.requests
    assert request.json["temperature"] == 0.35
    assert request.json[max_tokens_field] == 77
    assert request.json["model"] == model


async def test_provider_keys_and_webhook_secrets_never_reach_logs_or_api_responses(
    client: httpx.AsyncClient,
    tenant: Tenant,
    define: DefinitionFactory,
    harness: Any,
    fake: FakeLLMServer,
    providers: None,
    capfd: pytest.CaptureFixture[str],
) -> None:
    with Receiver() as receiver:
        hook = await client.post(
            "/v1/webhooks",
            json={"url": receiver.url, "events": ["workflow.completed", "workflow.failed"]},
            headers=tenant.headers,
        )
        assert hook.status_code == 201
        hook_id, secret = hook.json()["data"]["id"], hook.json()["data"]["secret"]
        receiver.secret = secret
        receiver.statuses = [500, 500]

        # A rejected key, a server error, then successes on both providers.
        runs = []
        for model, answer in (
            ("gpt-4o-mini", error(401, "Incorrect API key provided")),
            ("claude-3-5-haiku-latest", error(500, "upstream exploded")),
            ("gpt-4o-mini", openai_text("hi")),
            ("claude-3-5-haiku-latest", anthropic_text("hi")),
        ):
            fake.enqueue(answer)
            definition_id = await define([_llm_step(model, retry={"maxAttempts": 1})])
            runs.append(await _run(client, tenant, definition_id, harness))
        for _ in range(3):
            await deliver_due(harness.rt)
            await harness.rt.pool.execute(
                "UPDATE webhook_deliveries SET next_attempt_at = now() WHERE status = 'PENDING'"
            )
        assert receiver.requests, "the webhook was delivered at least once"

    # The keys were really sent to the providers (so they were in play)...
    sent = {r.headers.get("authorization", "") + r.headers.get("x-api-key", "") for r in fake.requests}
    assert any(OPENAI_KEY in s for s in sent) and any(ANTHROPIC_KEY in s for s in sent)

    h = tenant.headers
    bodies = [
        await client.get(f"/v1/webhooks/{hook_id}/deliveries", headers=h),
        await client.get("/v1/webhooks", headers=h),
        await client.get("/v1/workflow-runs", headers=h),
    ]
    for run_id in runs:
        for suffix in ("", "/events", "/llm-calls", "/tool-traces", "/cost"):
            bodies.append(await client.get(f"/v1/workflow-runs/{run_id}{suffix}", headers=h))
    statuses = {(r.request.url.path, r.status_code) for r in bodies}
    assert all(code == 200 for _, code in statuses), statuses
    everything = json.dumps([json.loads(r.text) for r in bodies])
    # The failures were recorded and served (so their messages were checked too).
    assert "Incorrect API key provided" in everything and "upstream exploded" in everything
    assert '"statusCode":500' in everything.replace(" ", "")  # a failed delivery attempt

    out, err = capfd.readouterr()
    haystacks = {"logs": out + err, **{str(r.request.url): r.text for r in bodies}}
    for where, text in haystacks.items():
        for secret_value in (OPENAI_KEY, ANTHROPIC_KEY, secret):
            assert secret_value not in text, f"a secret leaked into {where}"
