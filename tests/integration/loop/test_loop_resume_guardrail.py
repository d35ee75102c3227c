"""A run that crashes after writing GUARDRAIL_FAILED and resumes at the same final answer
announces the violation once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from stevora.engine import commands
from stevora.engine.driver import RunDriver
from stevora.testing.fake_llm import FakeLLMServer, openai_text
from tests.conftest import Harness, create_definition
from tests.integration.loop.conftest import SdkProviders, llm_step
from tests.integration.loop.test_loop_limits_guardrails import BLOCKLIST


async def test_guardrail_failure_is_written_once_when_the_run_resumes_after_a_crash(
    harness: Harness,
    workspace_id: str,
    fake: FakeLLMServer,
    sdk: SdkProviders,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake.openai.enqueue(openai_text("You get a Guaranteed Refund, no questions asked."))
    real_fail_step = RunDriver._fail_step
    crashes: list[str] = []

    async def crash_once(self: RunDriver, run: Any, step_run: Any, result: Any) -> None:
        if not crashes:
            crashes.append(run["id"])  # the worker "dies" after the guardrail event committed
            raise RuntimeError("worker crashed")
        await real_fail_step(self, run, step_run, result)

    monkeypatch.setattr(RunDriver, "_fail_step", crash_once)
    step = llm_step(guardrails={"postChecks": [BLOCKLIST], "onFailure": "block"})
    spec = {"name": "guarded", "version": "1", "steps": [step]}
    def_id = await create_definition(harness.rt, workspace_id, spec)
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id, {"question": "Refund?"})
    # Once the crashed worker let go of the lease, redispatch as the sweep would.
    for _ in range(250):
        row = await harness.rt.pool.fetchrow("SELECT lease_owner FROM workflow_runs WHERE id = $1", run["id"])
        if crashes and row["lease_owner"] is None:
            break
        await asyncio.sleep(0.02)
    await harness.dispatcher.dispatch(run["id"])
    row = await harness.wait_for_status(run["id"], "FAILED", "COMPLETED")

    assert crashes == [run["id"]]
    assert row["status"] == "FAILED" and row["error"]["code"] == "GUARDRAIL_FAILED"
    types = await harness.event_types(run["id"])
    assert types.count("GUARDRAIL_FAILED") == 1, types
    assert types.count("LLM_CALL_COMPLETED") == 1  # resumed from the checkpoint, not re-asked
    assert len(fake.openai.requests) == 1
