"""End-to-end flows through the real driver, claims and PostgreSQL (in-process dispatch)."""

from __future__ import annotations

from typing import Any

from stevora.engine import commands
from stevora.engine.steps.approval import decide_approval
from tests.conftest import Harness, create_definition


async def test_task_wait_condition_approval_workflow_completes_with_gap_free_events(
    harness: Harness, workspace_id: str
) -> None:
    calls: list[str] = []

    async def enrich(ctx: Any, step: Any) -> dict[str, Any]:
        calls.append(ctx.step_name)
        return {
            "status": "completed",
            "output": {"n": 1},
            "stateUpdates": {"lead": {"big": ctx.workflow_input["size"] > 10}, "draft": "hello"},
        }

    async def finish(ctx: Any) -> None:
        calls.append(ctx.step_name)

    harness.tasks.register("enrich", enrich)
    harness.tasks.register("finish", finish)
    def_id = await create_definition(
        harness.rt,
        workspace_id,
        {
            "name": "flow",
            "version": "1",
            "steps": [
                {"type": "task", "name": "enrich", "handler": "enrich"},
                {"type": "wait", "name": "pause", "durationMs": 50},
                {
                    "type": "condition",
                    "name": "is-big",
                    "expression": "lead.big",
                    "trueStep": "review",
                    "falseStep": "done",
                },
                {"type": "approval", "name": "review", "contentKey": "draft", "prompt": "ok?"},
                {"type": "task", "name": "done", "handler": "finish"},
            ],
        },
    )
    run, created = await commands.create_run(harness.rt, workspace_id, def_id, {"size": 50})
    assert created
    await harness.wait_for_status(run["id"], "WAITING")
    row = await harness.wait_for_status(run["id"], "WAITING")
    approval = None
    for _ in range(200):
        approval = await harness.rt.pool.fetchrow(
            "SELECT * FROM approval_requests WHERE workflow_run_id = $1", run["id"]
        )
        if approval:
            break
        import asyncio

        await asyncio.sleep(0.02)
    assert approval is not None and approval["content"] == "hello"
    await decide_approval(harness.rt, workspace_id, approval["id"], "edited", "HELLO", "ann")
    row = await harness.wait_for_status(run["id"], "COMPLETED", "FAILED")
    assert row["status"] == "COMPLETED", row["error"]
    assert row["state"]["draft"] == "HELLO"
    assert row["output"] == row["state"]
    events = await harness.events(run["id"])
    assert [e["sequence"] for e in events] == list(range(1, len(events) + 1))
    types = [e["event_type"] for e in events]
    assert types[0] == "WORKFLOW_STARTED" and types[-1] == "WORKFLOW_COMPLETED"
    assert "APPROVAL_REQUESTED" in types and "APPROVAL_DECIDED" in types
    assert calls == ["enrich", "done"]


async def test_failing_task_is_retried_with_backoff_then_fails_the_run(
    harness: Harness, workspace_id: str
) -> None:
    attempts: list[int] = []

    def flaky(ctx: Any) -> None:
        attempts.append(ctx.attempt)
        raise RuntimeError("boom")

    harness.tasks.register("flaky", flaky)
    def_id = await create_definition(
        harness.rt,
        workspace_id,
        {
            "name": "retry",
            "version": "1",
            "steps": [
                {
                    "type": "task",
                    "name": "t",
                    "handler": "flaky",
                    "retry": {"maxAttempts": 3, "backoffMs": 100},
                }
            ],
        },
    )
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id)
    row = await harness.wait_for_status(run["id"], "FAILED")
    assert attempts == [1, 2, 3]
    assert row["error"]["code"] == "STEP_FAILED" and "boom" in row["error"]["message"]
    types = await harness.event_types(run["id"])
    assert types.count("STEP_RETRYING") == 2 and types.count("STEP_FAILED") == 3
    assert types[-1] == "WORKFLOW_FAILED"
