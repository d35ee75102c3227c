"""Per-provider and per-model caps on concurrent LLM calls in one process."""

from __future__ import annotations

import asyncio

from stevora.engine import commands
from stevora.llm.messages import LlmRequest, LlmResponse
from stevora.llm.scripted_provider import ScriptedProvider
from tests.conftest import Harness, create_definition


class CountingProvider(ScriptedProvider):
    """The scripted agent with latency, recording the most calls it saw at once."""

    def __init__(self, name: str) -> None:
        super().__init__(name=name, latency_s=0.15)
        self.active = 0
        self.peak = 0

    async def complete(self, request: LlmRequest) -> LlmResponse:
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            return await super().complete(request)
        finally:
            self.active -= 1


async def _run_many(harness: Harness, workspace_id: str, provider: str, model: str, n: int) -> None:
    def_id = await create_definition(
        harness.rt,
        workspace_id,
        {
            "name": f"cap-{model}",
            "version": "1",
            "steps": [
                {
                    "type": "llm",
                    "name": "a",
                    "model": model,
                    "provider": provider,
                    "messages": [{"role": "user", "content": "hi {{input.i}}"}],
                }
            ],
        },
    )
    runs = [
        (await commands.create_run(harness.rt, workspace_id, def_id, {"i": i}))[0]["id"] for i in range(n)
    ]
    for run_id in runs:
        row = await harness.wait_for_status(run_id, "COMPLETED", "FAILED")
        assert row["status"] == "COMPLETED", row["error"]


async def test_a_provider_cap_bounds_concurrent_calls_to_that_provider(
    harness: Harness, workspace_id: str
) -> None:
    provider = CountingProvider("capped")
    harness.rt.providers.register("capped", provider)
    harness.rt.llm_limits["capped"] = asyncio.Semaphore(2)
    await _run_many(harness, workspace_id, "capped", "any-model", 6)
    assert provider.peak == 2


async def test_a_model_cap_bounds_calls_to_that_model_only(harness: Harness, workspace_id: str) -> None:
    provider = CountingProvider("uncapped")
    harness.rt.providers.register("uncapped", provider)
    harness.rt.llm_limits["slow-model"] = asyncio.Semaphore(1)
    await _run_many(harness, workspace_id, "uncapped", "slow-model", 4)
    assert provider.peak == 1
    provider.peak = 0
    await _run_many(harness, workspace_id, "uncapped", "fast-model", 4)
    assert provider.peak > 1  # other models of the same provider are not held back
