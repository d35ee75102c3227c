"""Prometheus: `/metrics` on the API after a run shows the run, step, model-call and tool series."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from stevora.api import create_app
from stevora.settings import Settings
from stevora.testing.fake_llm import FakeLLMServer, anthropic_text, openai_text, openai_tool_calls
from tests.conftest import Harness
from tests.integration.loop.conftest import SdkProviders, llm_step, run_workflow, tool_def

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def _scrape(client: httpx.AsyncClient) -> Samples:
    response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return _parse(response.text)


def _parse(text: str) -> Samples:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


async def test_metrics_after_a_run_show_runs_steps_model_calls_tools_and_queue_lag(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders, settings: Settings
) -> None:
    async def lookup(input: dict[str, Any]) -> dict[str, str]:
        if input["city"] == "Atlantis":
            raise LookupError("no such city")
        return {"weather": "sunny"}

    harness.tools.register("lookup", lookup)
    fake.openai.enqueue(
        openai_tool_calls(
            [("call_a", "lookup", '{"city": "Paris"}'), ("call_b", "lookup", '{"city": "Atlantis"}')],
            usage={"prompt_tokens": 30, "completion_tokens": 7, "total_tokens": 37},
        ),
        openai_text(
            "Sunny in Paris.", usage={"prompt_tokens": 50, "completion_tokens": 5, "total_tokens": 55}
        ),
    )
    transport = httpx.ASGITransport(app=create_app(settings, runtime=harness.rt))
    async with httpx.AsyncClient(transport=transport, base_url="http://stevora.test") as client:
        before = await _scrape(client)
        step = llm_step(tools=[tool_def("lookup", {"city": {"type": "string"}}, ["city"])])
        result = await run_workflow(harness, workspace_id, step)
        assert result.status == "COMPLETED", result.run["error"]
        await asyncio.sleep(0.05)  # the run's task leaves the pool just after the COMPLETED commit
        after = await _scrape(client)

    def grew(name: str, **labels: str) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    llm = {"provider": "openai", "model": "gpt-4o-mini"}
    assert grew("stevora_runs_created_total") == 1
    assert grew("stevora_runs_finished_total", status="COMPLETED") == 1
    assert grew("stevora_step_duration_seconds_count", step_type="llm", status="completed") == 1
    assert grew("stevora_llm_call_duration_seconds_count", **llm, status="ok") == 2
    assert grew("stevora_llm_tokens_total", **llm, kind="input") == 80
    assert grew("stevora_llm_tokens_total", **llm, kind="output") == 12
    assert grew("stevora_llm_cost_usd_total", **llm) > 0
    assert grew("stevora_tool_call_duration_seconds_count", tool="lookup", status="completed") == 1
    assert grew("stevora_tool_call_duration_seconds_count", tool="lookup", status="failed") == 1
    assert grew("stevora_tool_call_errors_total", tool="lookup", code="TOOL_ERROR") == 1
    assert grew("stevora_queue_lag_seconds_count") >= 1
    assert _value(after, "stevora_runs_in_flight") == 0
    # Unlabelled series exist before their first event, so dashboards show 0 rather than no data.
    assert ("stevora_sweep_pickups_total", frozenset()) in after


async def test_metrics_show_no_model_step_definition_or_tool_name_a_tenant_chose(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders, settings: Settings
) -> None:
    """Labels are bounded: a model the price list does not know is `other`, a known one by its
    catalogue name (never the tenant's suffix); step, definition and tool names appear nowhere."""
    fake.openai.enqueue(openai_text("Hi.", model="gpt-4o-acme-confidential-2"))
    fake.anthropic.enqueue(anthropic_text("Hi.", model="claude-3-5-sonnet-acme-confidential-1"))
    steps = [
        llm_step(name="acme-confidential-step-1", model="gpt-4o-acme-confidential-2"),
        llm_step(name="acme-confidential-step-2", model="claude-3-5-sonnet-acme-confidential-1"),
        llm_step(name="acme-confidential-step-3", model="scripted:acme-confidential-3"),
        {"type": "tool", "name": "acme-confidential-step-4", "tool": "acme_confidential_tool", "input": {}},
    ]
    result = await run_workflow(harness, workspace_id, steps)
    assert result.status == "FAILED"  # the tool step: TOOL_NOT_REGISTERED
    assert [c["model"] for c in result.llm_calls] == [
        "gpt-4o-acme-confidential-2",
        "claude-3-5-sonnet-acme-confidential-1",
        "scripted:acme-confidential-3",
    ]  # the run's own records keep the names

    transport = httpx.ASGITransport(app=create_app(settings, runtime=harness.rt))
    async with httpx.AsyncClient(transport=transport, base_url="http://stevora.test") as client:
        response = await client.get("/metrics")
    assert response.status_code == 200
    assert "acme" not in response.text.lower()
    samples = _parse(response.text)
    assert _value(
        samples, "stevora_llm_call_duration_seconds_count", provider="openai", model="other", status="ok"
    )
    anthropic = {"provider": "anthropic", "model": "claude-3-5-sonnet", "status": "ok"}
    assert _value(samples, "stevora_llm_call_duration_seconds_count", **anthropic)


async def test_with_a_metrics_token_the_api_metrics_need_it_as_a_bearer_token(
    harness: Harness, settings: Settings
) -> None:
    guarded = settings.model_copy(update={"metrics_token": "m3trics-s3cret"})
    transport = httpx.ASGITransport(app=create_app(guarded, runtime=harness.rt))
    async with httpx.AsyncClient(transport=transport, base_url="http://stevora.test") as client:
        missing = await client.get("/metrics")
        wrong = await client.get("/metrics", headers={"Authorization": "Bearer nope"})
        other_scheme = await client.get("/metrics", headers={"Authorization": "Basic m3trics-s3cret"})
        right = await client.get("/metrics", headers={"Authorization": "Bearer m3trics-s3cret"})
    for refused in (missing, wrong, other_scheme):
        assert refused.status_code == 401 and "stevora_" not in refused.text
        assert refused.headers["www-authenticate"].startswith("Bearer")
    assert right.status_code == 200 and "stevora_runs_created_total" in right.text
