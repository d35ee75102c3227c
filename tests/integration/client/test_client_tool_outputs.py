"""The client's side of awaited tool calls: `required_action`, `submit_tool_outputs` (sync and
async, typed or dict items, typed errors), and the parent/child links of workflows as tools."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from stevora.client import (
    AgentRuntime,
    AsyncAgentRuntime,
    InvalidStateTransition,
    InvalidToolOutputs,
    PendingToolCall,
    RequiredAction,
    ToolOutput,
    ToolOutputTooLarge,
    ValidationFailed,
    WorkflowRun,
)
from stevora.ids import new_id
from tests.awaited_tools import LOCATION, WEATHER
from tests.conftest import Harness


def agent_spec(*tools: Any) -> dict[str, Any]:
    step = {
        "type": "llm",
        "name": "agent",
        "model": "scripted",
        "messages": [{"role": "user", "content": "What should I wear?"}],
        "tools": list(tools),
    }
    return {"name": new_id("agent"), "version": "1", "steps": [step]}


async def waiting(client: AsyncAgentRuntime, run_id: str, timeout_s: float = 15.0) -> WorkflowRun:
    """The run once it waits for tool outputs."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        run = await client.workflows.get(run_id)
        if run.required_action is not None or run.is_terminal:
            return run
        assert asyncio.get_running_loop().time() < deadline, f"run {run_id} is {run.status}"
        await asyncio.sleep(0.02)


def test_tool_output_needs_exactly_one_of_output_or_error() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        ToolOutput("call_1")
    with pytest.raises(ValueError, match="exactly one"):
        ToolOutput("call_1", output=1, error="no")
    assert ToolOutput("call_1", output=None).to_json() == {"toolCallId": "call_1", "output": None}
    assert ToolOutput("call_1", error="no").to_json() == {"toolCallId": "call_1", "error": "no"}


async def test_async_client_answers_the_required_action_in_two_submissions(
    client: AsyncAgentRuntime, harness: Harness
) -> None:
    definition = await client.definitions.apply(agent_spec(WEATHER, LOCATION))
    run = await waiting(client, (await client.workflows.create(definition.id)).id)

    assert run.status == "WAITING"
    assert isinstance(run.required_action, RequiredAction)
    assert run.required_action.type == "submit_tool_outputs"
    calls = run.required_action.tool_calls
    assert all(isinstance(c, PendingToolCall) for c in calls)
    assert [c.name for c in calls] == ["get_weather", "get_location"]
    assert isinstance(calls[0].arguments, dict) and "city" in calls[0].arguments
    weather, location = calls

    # A typed item: the run stays WAITING with the other call.
    partial = await client.workflows.submit_tool_outputs(
        run.id, [ToolOutput(location.id, output={"lat": 38.7})]
    )
    assert partial.status == "WAITING"
    assert partial.required_action is not None
    assert [c.id for c in partial.required_action.tool_calls] == [weather.id]
    assert partial.step_runs, "the answer is the run as get returns it"

    # A dict item in the API's own shape (snake_case key accepted too) resumes the run.
    resumed = await client.workflows.submit_tool_outputs(
        run.id, [{"tool_call_id": weather.id, "output": "18°C"}]
    )
    assert resumed.required_action is None
    done = await client.workflows.wait_for_completion(run.id, timeout=15, poll_interval=0.05)
    assert done.status == "COMPLETED"
    results = [m for m in harness.scripted.requests[-1].messages if m.role == "tool"]
    assert [r.tool_call_id for r in results] == [weather.id, location.id]
    assert results[0].content == "18°C"

    traces = await client.workflows.tool_traces(run.id)
    assert sorted(t.tool_name for t in traces) == ["get_location", "get_weather"]
    assert all(t.child_run_id is None for t in traces)

    # Retrying the last submission after the run resumed is safe.
    again = await client.workflows.submit_tool_outputs(run.id, [ToolOutput(weather.id, output="18°C")])
    assert again.status == "COMPLETED"


async def test_an_error_item_fails_the_call_and_bad_requests_raise_typed_errors(
    client: AsyncAgentRuntime, harness: Harness
) -> None:
    definition = await client.definitions.apply(agent_spec(LOCATION))
    run = await waiting(client, (await client.workflows.create(definition.id)).id)
    assert run.required_action is not None
    (call,) = run.required_action.tool_calls

    with pytest.raises(InvalidToolOutputs) as unknown:
        await client.workflows.submit_tool_outputs(run.id, [ToolOutput("call_nope", output=1)])
    assert unknown.value.code == "INVALID_TOOL_OUTPUTS" and unknown.value.status_code == 400
    assert "call_nope" in unknown.value.message
    assert isinstance(unknown.value, ValidationFailed)

    big = "x" * (harness.rt.settings.max_tool_output_bytes + 1)
    with pytest.raises(ToolOutputTooLarge) as too_large:
        await client.workflows.submit_tool_outputs(run.id, [ToolOutput(call.id, output=big)])
    assert too_large.value.code == "TOOL_OUTPUT_TOO_LARGE"

    answered = await client.workflows.submit_tool_outputs(
        run.id, [ToolOutput(call.id, error="Permission denied")]
    )
    assert answered.required_action is None
    await client.workflows.wait_for_completion(run.id, timeout=15, poll_interval=0.05)
    (trace,) = await client.workflows.tool_traces(run.id)
    assert trace.status == "failed" and trace.error == "Permission denied"

    with pytest.raises(InvalidStateTransition):
        await client.workflows.submit_tool_outputs(run.id, [ToolOutput("call_other", output=1)])


async def test_sync_client_submits_tool_outputs_over_real_http(
    client: AsyncAgentRuntime, server_url: str, api_key: str
) -> None:
    definition = await client.definitions.apply(agent_spec(LOCATION))
    run = await waiting(client, (await client.workflows.create(definition.id)).id)
    assert run.required_action is not None
    call_id = run.required_action.tool_calls[0].id

    def answer() -> WorkflowRun:
        with AgentRuntime(api_key, base_url=server_url) as rt:
            assert rt.workflows.get(run.id).required_action is not None
            return rt.workflows.submit_tool_outputs(run.id, [ToolOutput(call_id, output="Lisbon")])

    answered = await asyncio.to_thread(answer)
    assert answered.id == run.id and answered.required_action is None
    done = await client.workflows.wait_for_completion(run.id, timeout=15, poll_interval=0.05)
    assert done.status == "COMPLETED"


async def test_a_workflow_tool_links_parent_and_child_runs(
    client: AsyncAgentRuntime, harness: Harness
) -> None:
    async def shout(ctx: Any) -> dict[str, Any]:
        return {"status": "completed", "output": {}, "stateUpdates": {"loud": "HELLO"}}

    harness.tasks.register("shout", shout)
    child = await client.definitions.apply(
        {
            "name": new_id("shout"),
            "version": "1",
            "description": "Shout a word",
            "defaultParams": "word",
            "steps": [{"type": "task", "name": "shout", "handler": "shout"}],
        }
    )
    parent = await client.definitions.apply(agent_spec({"name": "shout", "workflow": child.name}))
    run = await client.workflows.create(parent.id)
    done = await client.workflows.wait_for_completion(run.id, timeout=20, poll_interval=0.05)
    assert done.status == "COMPLETED" and done.parent_run_id is None

    (trace,) = await client.workflows.tool_traces(run.id)
    assert trace.child_run_id is not None and trace.output_json == {"loud": "HELLO"}
    children = await client.workflows.list(parent_run_id=run.id)
    assert [c.id for c in children.data] == [trace.child_run_id]
    kid = await client.workflows.get(trace.child_run_id)
    assert kid.parent_run_id == run.id and kid.parent_tool_call_id == trace.tool_call_id
    assert (await client.workflows.list(parent_run_id=kid.id)).data == []
