"""The Python client against the real API app and engine (PostgreSQL, in-process runs).

The async client talks to the app in-process (`httpx.ASGITransport`); the sync client talks to a
real uvicorn server on 127.0.0.1 and is called from a thread.
"""

from __future__ import annotations

import asyncio
import socket
from datetime import datetime
from typing import Any

import pytest

from stevora.client import (
    AgentRuntime,
    AsyncAgentRuntime,
    AuthenticationFailed,
    Conflict,
    CreatedApiKey,
    Event,
    InvalidStateTransition,
    NotFound,
    StepRun,
    StevoraConnectionError,
    ValidationFailed,
    WaitTimeout,
    WorkflowRun,
)
from stevora.errors import StevoraError
from stevora.ids import new_id
from tests.conftest import Harness

TOOL = {
    "name": "lookup",
    "description": "Look a thing up",
    "parameters": {"type": "object", "properties": {}},
}


def task_spec(name: str | None = None, *, wait_ms: int = 0, approval: bool = False) -> dict[str, Any]:
    steps: list[dict[str, Any]] = [{"type": "task", "name": "greet", "handler": "greet"}]
    if wait_ms:
        steps.append({"type": "wait", "name": "nap", "durationMs": wait_ms})
    if approval:
        steps.append({"type": "approval", "name": "review", "contentKey": "greeting", "prompt": "Send it?"})
    return {"name": name or new_id("wf"), "version": "1.0.0", "steps": steps}


def register_greet(harness: Harness) -> None:
    async def greet(ctx: Any) -> dict[str, Any]:
        who = ctx.workflow_input.get("name", "world")
        return {"status": "completed", "output": {"who": who}, "stateUpdates": {"greeting": f"Hello, {who}"}}

    harness.tasks.register("greet", greet)


async def test_health_needs_no_api_key_and_reports_each_check(app: Any) -> None:
    import httpx

    async with AsyncAgentRuntime(
        None, base_url="http://t", transport=httpx.ASGITransport(app=app)
    ) as anonymous:
        health = await anonymous.health()
    assert health.status == "ok"
    assert health.checks == {"database": "ok", "queue": "ok"}


async def test_current_workspace_is_the_one_the_key_belongs_to(
    client: AsyncAgentRuntime, workspace_id: str
) -> None:
    workspace = await client.workspaces.current()
    assert workspace.id == workspace_id
    assert isinstance(workspace.created_at, datetime) and workspace.created_at.tzinfo is not None


async def test_apply_creates_once_then_returns_the_same_definition(client: AsyncAgentRuntime) -> None:
    spec = task_spec()
    first = await client.definitions.apply(spec)
    again = await client.definitions.apply(spec)
    assert again.id == first.id and again.version == "1.0.0"
    assert [s["name"] for s in first.steps] == ["greet"]
    with pytest.raises(Conflict) as caught:
        await client.definitions.create(spec)
    assert caught.value.code == "CONFLICT" and caught.value.status_code == 409
    assert (await client.definitions.get(first.id)).name == spec["name"]
    assert (await client.definitions.find(spec["name"])).id == first.id


async def test_apply_refuses_a_changed_workflow_under_an_existing_version(client: AsyncAgentRuntime) -> None:
    spec = task_spec()
    await client.definitions.apply(spec)
    changed = {**spec, "steps": [{**spec["steps"][0], "handler": "other"}]}
    with pytest.raises(Conflict) as caught:
        await client.definitions.apply(changed)
    assert caught.value.details["differences"] == ["steps[0].handler"]
    assert "new version" in caught.value.message


async def test_run_completes_and_comes_back_typed_with_its_step_runs(
    client: AsyncAgentRuntime, harness: Harness
) -> None:
    register_greet(harness)
    definition = await client.definitions.apply(task_spec(wait_ms=50))
    run = await client.workflows.create(definition.id, {"name": "Ada"}, idempotency_key="k-1")
    assert run.created is True and run.status == "PENDING" and run.input == {"name": "Ada"}

    done = await client.workflows.wait_for_completion(run.id, timeout=10, poll_interval=0.05)
    assert isinstance(done, WorkflowRun) and done.status == "COMPLETED" and done.is_terminal
    assert done.output == {"greeting": "Hello, Ada"}
    assert done.definition is not None and done.definition.name == definition.name
    assert done.step_runs is not None and [s.step_name for s in done.step_runs] == ["greet", "nap"]
    assert all(isinstance(s, StepRun) and s.status == "COMPLETED" for s in done.step_runs)
    assert done.step_runs[1].duration_ms is not None and done.step_runs[1].duration_ms >= 40
    assert done.completed_at is not None and done.completed_at.tzinfo is not None
    assert done.total_cost_cents == 0 and done.total_cost_usd == 0

    same = await client.workflows.create(definition.id, {"name": "Ada"}, idempotency_key="k-1")
    assert same.id == run.id and same.created is False
    listed = await client.workflows.list(definition_id=definition.id, status="COMPLETED")
    assert [r.id for r in listed.data] == [run.id] and listed.meta.total == 1


async def test_events_come_in_pages_and_iter_events_walks_every_page(
    client: AsyncAgentRuntime, harness: Harness
) -> None:
    register_greet(harness)
    definition = await client.definitions.apply(task_spec(wait_ms=10))
    run = await client.workflows.create(definition.id)
    await client.workflows.wait_for_completion(run.id, timeout=10, poll_interval=0.05)

    first = await client.workflows.events(run.id, page=1, page_size=2)
    assert [e.sequence for e in first.data] == [1, 2] and first.has_next
    assert first.meta.page_size == 2 and first.meta.total_pages == -(-first.meta.total // 2)
    events = [e async for e in client.workflows.iter_events(run.id, page_size=2)]
    assert [e.sequence for e in events] == list(range(1, first.meta.total + 1))
    assert events[0].event_type == "WORKFLOW_STARTED" and events[-1].event_type == "WORKFLOW_COMPLETED"
    assert all(isinstance(e, Event) and e.workflow_run_id == run.id for e in events)


async def test_stream_follows_a_run_to_its_end_and_resumes_after_an_event_id(
    client: AsyncAgentRuntime, harness: Harness
) -> None:
    register_greet(harness)
    definition = await client.definitions.apply(task_spec(wait_ms=300))
    run = await client.workflows.create(definition.id)
    streamed = [e async for e in client.workflows.stream(run.id)]
    assert streamed[-1].event_type == "WORKFLOW_COMPLETED"
    assert [e.sequence for e in streamed] == list(range(1, len(streamed) + 1))
    assert "STEP_STARTED" in [e.event_type for e in streamed]

    rest = [e async for e in client.workflows.stream(run.id, last_event_id=3)]
    assert [e.sequence for e in rest] == [e.sequence for e in streamed[3:]]


async def test_api_errors_raise_typed_exceptions_with_code_status_and_details(
    client: AsyncAgentRuntime, harness: Harness, app: Any
) -> None:
    with pytest.raises(NotFound) as not_found:
        await client.workflows.get("wfrun_missing")
    assert not_found.value.code == "NOT_FOUND" and not_found.value.status_code == 404
    assert not_found.value.details == {"workflowRunId": "wfrun_missing"}
    assert isinstance(not_found.value, StevoraError)

    with pytest.raises(ValidationFailed) as invalid:
        await client.definitions.create(
            {"name": "bad", "version": "1", "steps": [{"type": "nope", "name": "x"}]}
        )
    assert invalid.value.status_code == 400 and invalid.value.errors
    assert invalid.value.errors[0]["path"].startswith("steps[0]")

    register_greet(harness)
    definition = await client.definitions.apply(task_spec())
    run = await client.workflows.create(definition.id)
    await client.workflows.wait_for_completion(run.id, timeout=10, poll_interval=0.05)
    with pytest.raises(InvalidStateTransition) as bad_state:
        await client.workflows.cancel(run.id)
    assert isinstance(bad_state.value, Conflict) and bad_state.value.code == "INVALID_STATE_TRANSITION"

    import httpx

    transport = httpx.ASGITransport(app=app)
    async with AsyncAgentRuntime("stv_" + "x" * 32, base_url="http://t", transport=transport) as wrong:
        with pytest.raises(AuthenticationFailed) as denied:
            await wrong.workflows.list()
    assert denied.value.message == "Invalid or revoked API key"


async def test_unreachable_server_raises_a_connection_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with AsyncAgentRuntime("stv_x", base_url=f"http://127.0.0.1:{port}", timeout=2) as rt:
        with pytest.raises(StevoraConnectionError) as caught:
            await rt.health()
    assert caught.value.code == "CONNECTION_ERROR" and "GET /health" in caught.value.message


async def test_wait_for_completion_times_out_with_the_run_as_last_seen(
    client: AsyncAgentRuntime, harness: Harness
) -> None:
    register_greet(harness)
    definition = await client.definitions.apply(task_spec(approval=True))
    run = await client.workflows.create(definition.id)
    await harness.wait_for_status(
        run.id, "WAITING"
    )  # so the last status seen is WAITING, even on a busy machine
    with pytest.raises(WaitTimeout) as caught:
        await client.workflows.wait_for_completion(run.id, timeout=0.5, poll_interval=0.05)
    assert isinstance(caught.value, TimeoutError)
    assert caught.value.run.id == run.id and caught.value.run.status == "WAITING"


async def test_deciding_an_approval_resumes_the_run_with_the_edited_content(
    client: AsyncAgentRuntime, harness: Harness
) -> None:
    register_greet(harness)
    definition = await client.definitions.apply(task_spec(approval=True))
    run = await client.workflows.create(definition.id, {"name": "Bo"})
    await harness.wait_for_status(run.id, "WAITING")
    pending = [a for a in await client.approvals.list(pending=True) if a.workflow_run_id == run.id]
    assert len(pending) == 1 and pending[0].pending and pending[0].content == "Hello, Bo"
    assert (await client.approvals.get(pending[0].id)).prompt == "Send it?"

    decided = await client.approvals.decide(pending[0].id, "edited", edited_content="Hi Bo", decided_by="ann")
    assert decided.decision == "edited" and decided.decided_by == "ann" and not decided.pending
    done = await client.workflows.wait_for_completion(run.id, timeout=10, poll_interval=0.05)
    assert done.status == "COMPLETED" and done.state["greeting"] == "Hi Bo"
    assert pending[0].id in [a.id for a in await client.approvals.list(pending=False)]
    with pytest.raises(Conflict):
        await client.approvals.decide(pending[0].id, "approved")


async def test_run_controls_cancel_retry_pause_and_signal(
    client: AsyncAgentRuntime, harness: Harness
) -> None:
    attempts: list[int] = []

    def flaky(ctx: Any) -> None:
        attempts.append(ctx.attempt)
        if len(attempts) == 1:
            raise RuntimeError("first time fails")

    harness.tasks.register("flaky", flaky)
    failing = await client.definitions.apply(
        {
            "name": new_id("wf"),
            "version": "1",
            "steps": [{"type": "task", "name": "t", "handler": "flaky", "retry": {"maxAttempts": 1}}],
        }
    )
    run = await client.workflows.create(failing.id)
    failed = await client.workflows.wait_for_completion(run.id, timeout=10, poll_interval=0.05)
    assert failed.status == "FAILED" and "first time fails" in (failed.error or {}).get("message", "")
    await client.workflows.retry(run.id)
    assert (
        await client.workflows.wait_for_completion(run.id, timeout=10, poll_interval=0.05)
    ).status == "COMPLETED"

    signal = await client.definitions.apply(
        {
            "name": new_id("wf"),
            "version": "1",
            "steps": [{"type": "external_event", "name": "hook", "signalType": "paid"}],
        }
    )
    waiting = await client.workflows.create(signal.id)
    await harness.wait_for_status(waiting.id, "WAITING")
    await client.workflows.resume(waiting.id, "paid", {"amount": 5})
    resumed = await client.workflows.wait_for_completion(waiting.id, timeout=10, poll_interval=0.05)
    assert resumed.state == {"amount": 5}

    cancelled_run = await client.workflows.create(signal.id)
    await harness.wait_for_status(cancelled_run.id, "WAITING")
    assert (await client.workflows.cancel(cancelled_run.id)).status == "CANCELLED"
    with pytest.raises(InvalidStateTransition):
        await client.workflows.pause(cancelled_run.id)


async def test_llm_step_traces_and_costs_are_readable(client: AsyncAgentRuntime, harness: Harness) -> None:
    harness.tools.register("lookup", lambda input: {"found": True})
    definition = await client.definitions.apply(
        {
            "name": new_id("wf"),
            "version": "1",
            "steps": [
                {
                    "type": "llm",
                    "name": "agent",
                    "model": "scripted",
                    "tools": [TOOL],
                    "messages": [{"role": "user", "content": "find it"}],
                }
            ],
        }
    )
    run = await client.workflows.create(definition.id)
    done = await client.workflows.wait_for_completion(run.id, timeout=10, poll_interval=0.05)
    assert done.status == "COMPLETED", done.error

    calls = await client.workflows.llm_calls(run.id, step_name="agent")
    assert [c.round for c in calls] == [1, 2] and all(c.model == "scripted" for c in calls)
    traces = await client.workflows.tool_traces(run.id)
    assert [(t.tool_name, t.status) for t in traces] == [("lookup", "completed")]
    assert traces[0].output_json == {"found": True}
    cost = await client.workflows.cost(run.id)
    assert cost.workflow_run_id == run.id and len(cost.calls) == 2
    assert cost.total_input_tokens == sum(c.input_tokens for c in cost.calls) > 0
    summary = await client.cost.summary(from_=done.created_at)
    assert summary.call_count >= 2 and summary.run_count >= 1
    assert "scripted" in [m.model for m in summary.by_model]


async def test_api_keys_can_be_created_listed_and_revoked(client: AsyncAgentRuntime, app: Any) -> None:
    import httpx

    created = await client.api_keys.create("ci")
    assert isinstance(created, CreatedApiKey) and created.key.startswith("stv_")
    assert created.id in [k.id for k in await client.api_keys.list()]
    transport = httpx.ASGITransport(app=app)
    async with AsyncAgentRuntime(created.key, base_url="http://t", transport=transport) as second:
        assert (await second.workspaces.current()).id == created.workspace_id
        revoked = await client.api_keys.revoke(created.id)
        assert revoked.revoked_at is not None
        with pytest.raises(AuthenticationFailed):
            await second.workspaces.current()


async def test_webhooks_can_be_created_listed_inspected_and_deleted(client: AsyncAgentRuntime) -> None:
    hook = await client.webhooks.create("https://example.com/hook", ["workflow.completed"])
    assert hook.secret.startswith("whsec_") and hook.events == ["workflow.completed"]
    assert hook.id in [w.id for w in await client.webhooks.list()]
    deliveries = await client.webhooks.deliveries(hook.id)
    assert deliveries.data == [] and deliveries.meta.total == 0
    assert (await client.webhooks.delete(hook.id)).id == hook.id
    with pytest.raises(NotFound):
        await client.webhooks.deliveries(hook.id)


async def test_sync_client_runs_and_streams_a_workflow_over_a_real_server(
    server_url: str, api_key: str, harness: Harness
) -> None:
    register_greet(harness)
    spec = task_spec(approval=True)

    def start() -> tuple[str, str]:
        with AgentRuntime(api_key, base_url=server_url) as rt:
            assert rt.health().status == "ok"
            definition = rt.definitions.apply(spec)
            return definition.id, rt.workflows.create(definition.id, {"name": "Cy"}).id

    def follow(run_id: str) -> list[Event]:
        with AgentRuntime(api_key, base_url=server_url) as rt:
            return list(rt.workflows.stream(run_id))

    _, run_id = await asyncio.to_thread(start)
    follower = asyncio.ensure_future(asyncio.to_thread(follow, run_id))
    await harness.wait_for_status(run_id, "WAITING")
    await asyncio.sleep(0.5)
    assert not follower.done()  # the stream stays open while the run waits

    def approve_and_wait() -> WorkflowRun:
        with AgentRuntime(api_key, base_url=server_url) as rt:
            (approval,) = [a for a in rt.approvals.list(pending=True) if a.workflow_run_id == run_id]
            rt.approvals.decide(approval.id, "approved", decided_by="sync")
            return rt.workflows.wait_for_completion(run_id, timeout=10, poll_interval=0.05)

    done = await asyncio.to_thread(approve_and_wait)
    streamed = await asyncio.wait_for(follower, 10)
    assert done.status == "COMPLETED"
    types = [e.event_type for e in streamed]
    assert types[0] == "WORKFLOW_STARTED" and types[-1] == "WORKFLOW_COMPLETED"
    assert "APPROVAL_REQUESTED" in types and "APPROVAL_DECIDED" in types

    def all_events() -> list[int]:
        with AgentRuntime(api_key, base_url=server_url) as rt:
            return [e.sequence for e in rt.workflows.iter_events(run_id, page_size=3)]

    assert await asyncio.to_thread(all_events) == [e.sequence for e in streamed]


async def test_apply_twice_with_a_tool_referenced_by_name_returns_the_stored_definition(
    client: AsyncAgentRuntime,
) -> None:
    llm_step = {
        "type": "llm",
        "name": "agent",
        "model": "scripted",
        "messages": [{"role": "user", "content": "Look it up"}],
        "tools": ["search_docs", {"name": "lookup"}],
    }
    spec = {"name": new_id("wf"), "version": "1", "steps": [llm_step]}
    first = await client.definitions.apply(spec)
    again = await client.definitions.apply(spec)
    assert again.id == first.id
    changed = {**spec, "steps": [{**llm_step, "tools": ["search_docs", "other"]}]}
    with pytest.raises(Conflict) as caught:
        await client.definitions.apply(changed)
    assert caught.value.details["differences"] == ["steps[0].tools[1].name"]


async def test_a_run_created_with_a_budget_waits_and_set_budget_raises_it(
    client: AsyncAgentRuntime, harness: Harness
) -> None:
    @harness.tools.tool
    async def lookup() -> str:
        """Look something up."""
        return "found"

    definition = await client.definitions.apply({
        "name": new_id("wf"), "version": "1",
        "steps": [{"type": "llm", "name": "agent", "model": "scripted:rounds=2", "maxToolRounds": 2,
                   "tools": ["lookup"], "messages": [{"role": "user", "content": "go"}]}],
    })  # fmt: skip
    run = await client.workflows.create(
        definition.id, budget={"maxModelCalls": 1, "onBudgetExceeded": "pause"}
    )
    assert run.budget == {"maxModelCalls": 1, "onBudgetExceeded": "pause"}
    await harness.wait_for_status(run.id, "WAITING")
    waiting = await client.workflows.get(run.id)
    assert waiting.budget_used == {"costCents": 0.0, "modelCalls": 1, "toolCalls": 1}

    with pytest.raises(ValidationFailed):
        await client.workflows.set_budget(run.id, max_model_calls=-1)
    raised = await client.workflows.set_budget(run.id, max_model_calls=3)
    assert raised.budget == {"maxModelCalls": 3, "onBudgetExceeded": "pause"}
    done = await client.workflows.wait_for_completion(run.id, timeout=10, poll_interval=0.05)
    assert done.status == "COMPLETED" and done.budget_used == {
        "costCents": 0.0,
        "modelCalls": 3,
        "toolCalls": 2,
    }
