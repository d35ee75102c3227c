"""The client's synchronous agent loop (issue 22): `create(..., wait=)` with an ad-hoc definition,
`run_until_action`, `submit_tool_outputs(..., wait=)` — the loop of docs/client.md, over real HTTP."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from stevora.client import AgentRuntime, AsyncAgentRuntime, ToolOutput, WaitTimeout, WorkflowRun
from tests.awaited_tools import LOCATION, WEATHER
from tests.conftest import Harness

TOOLS = {"get_weather": lambda city: f"18°C in {city}", "get_location": lambda: "Lisbon"}


def agent(*tools: Any, **extra: Any) -> dict[str, Any]:
    step = {
        "type": "llm",
        "name": "agent",
        "model": "scripted",
        "messages": [{"role": "user", "content": "What should I wear?"}],
        "tools": list(tools),
        **extra,
    }
    return {"steps": [step]}


async def test_the_documented_client_tool_loop_runs_over_real_http(server_url: str, api_key: str) -> None:
    """docs/client.md's loop, as written there: no SSE, no webhook, no sleep."""

    def loop() -> tuple[WorkflowRun, int]:
        requests = 0
        with AgentRuntime(api_key, base_url=server_url) as rt:
            run = rt.workflows.create(agent(WEATHER, LOCATION), {}, wait=30)
            requests += 1
            while run.required_action:
                outputs = [
                    ToolOutput(c.id, output=TOOLS[c.name](**c.arguments))
                    for c in run.required_action.tool_calls
                ]
                run = rt.workflows.submit_tool_outputs(run.id, outputs, wait=30)
                requests += 1
            return run, requests

    run, requests = await asyncio.to_thread(loop)
    assert run.status == "COMPLETED", run.error
    assert requests == 2  # one create, one submission: each answered once the run had settled
    assert "18°C in" in run.state["agent"] and "Lisbon" in run.state["agent"]


async def test_run_until_action_long_polls_to_the_action_then_to_the_end(
    client: AsyncAgentRuntime, harness: Harness
) -> None:
    created = await client.workflows.create(agent(LOCATION))
    assert created.status == "PENDING" and created.created
    run = await client.workflows.run_until_action(created.id, timeout=15)
    assert run.required_action is not None
    (call,) = run.required_action.tool_calls
    await client.workflows.submit_tool_outputs(run.id, [ToolOutput(call.id, output="Porto")])
    done = await client.workflows.run_until_action(run.id, timeout=15)
    assert done.status == "COMPLETED" and "Porto" in done.state["agent"]


async def test_run_until_action_times_out_with_the_last_run_seen(client: AsyncAgentRuntime) -> None:
    timer = {"steps": [{"type": "wait", "name": "pause", "durationMs": 60_000}]}
    run = await client.workflows.create(timer)
    began = time.monotonic()
    with pytest.raises(WaitTimeout) as raised:
        await client.workflows.run_until_action(run.id, timeout=0.5, wait=0.2)
    assert raised.value.run.status == "WAITING"
    assert time.monotonic() - began < 5
