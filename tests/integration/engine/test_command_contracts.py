"""What commands answer when they refuse, and what they record when they act: the details an API
client and the timeline rely on (pinned after mutation testing found them unpinned)."""

from __future__ import annotations

from typing import Any

import pytest

from stevora.engine import commands
from stevora.errors import ConflictError, InvalidStateTransition
from stevora.ids import new_id
from tests.conftest import Harness, create_definition


async def _run(harness: Harness, ws: str, *steps: dict[str, Any]) -> str:
    def_id = await create_definition(
        harness.rt, ws, {"name": new_id("c"), "version": "1", "steps": list(steps)}
    )
    run, _ = await commands.create_run(harness.rt, ws, def_id)
    return str(run["id"])


async def test_retrying_a_run_that_did_not_fail_names_its_status(harness: Harness, workspace_id: str) -> None:
    harness.tasks.register("ok", lambda ctx: None)
    run_id = await _run(harness, workspace_id, {"type": "task", "name": "t", "handler": "ok"})
    await harness.wait_for_status(run_id, "COMPLETED")
    with pytest.raises(InvalidStateTransition) as refused:
        await commands.retry_run(harness.rt, workspace_id, run_id)
    assert refused.value.message == "Only a FAILED run can be retried; this run is COMPLETED"
    assert refused.value.details == {"workflowRunId": run_id, "status": "COMPLETED"}


async def test_signals_are_refused_with_the_details_a_client_needs(
    harness: Harness, workspace_id: str
) -> None:
    run_id = await _run(
        harness, workspace_id, {"type": "external_event", "name": "pay", "signalType": "paid"}
    )
    await harness.wait_for_status(run_id, "WAITING")

    with pytest.raises(InvalidStateTransition) as missing:
        await commands.resume_run(harness.rt, workspace_id, run_id, None, {})
    assert "signalType" in missing.value.message and "WAITING" in missing.value.message
    assert missing.value.details == {
        "workflowRunId": run_id,
        "status": "WAITING",
        "errors": [{"path": "signalType", "message": "Field required"}],
    }
    with pytest.raises(ConflictError) as mismatch:
        await commands.resume_run(harness.rt, workspace_id, run_id, "refunded", {})
    assert mismatch.value.message == "Run is waiting for signal 'paid', not 'refunded'"
    assert mismatch.value.details == {"expectedSignalType": "paid", "signalType": "refunded"}

    await commands.resume_run(harness.rt, workspace_id, run_id, "paid", {"b": 2, "a": 1})
    row = await harness.wait_for_status(run_id, "COMPLETED")
    events = await harness.events(run_id)
    (resumed,) = [e["payload"] for e in events if e["event_type"] == "WORKFLOW_RESUMED"]
    assert resumed == {"reason": "signal", "signalType": "paid", "payloadKeys": ["a", "b"]}
    output = await harness.rt.pool.fetchval(
        "SELECT output FROM step_runs WHERE workflow_run_id = $1 AND step_name = 'pay'", run_id
    )
    assert output == {"signalType": "paid", "payload": {"b": 2, "a": 1}}
    assert row["state"] == {"a": 1, "b": 2}

    with pytest.raises(InvalidStateTransition) as not_waiting:
        await commands.resume_run(harness.rt, workspace_id, run_id, "paid", {})
    assert not_waiting.value.message == "Workflow run is not waiting for an external event"
    assert not_waiting.value.details == {"workflowRunId": run_id, "status": "COMPLETED"}


async def test_pause_and_resume_are_recorded_as_manual(harness: Harness, workspace_id: str) -> None:
    run_id = await _run(harness, workspace_id, {"type": "wait", "name": "w", "durationMs": 60_000})
    await harness.wait_for_status(run_id, "WAITING")
    await harness.rt.pool.execute("UPDATE workflow_runs SET status = 'RUNNING' WHERE id = $1", run_id)
    paused = await commands.pause_run(harness.rt, workspace_id, run_id)
    assert paused["status"] == "PAUSED"
    resumed = await commands.resume_run(harness.rt, workspace_id, run_id, None, None)
    assert resumed["status"] == "RUNNING" and resumed["lease_owner"] is None
    reasons = [
        (e["event_type"], e["payload"].get("reason"))
        for e in await harness.events(run_id)
        if e["event_type"] in ("WORKFLOW_PAUSED", "WORKFLOW_RESUMED")
    ]
    assert reasons[-2:] == [("WORKFLOW_PAUSED", "manual"), ("WORKFLOW_RESUMED", "manual")]


async def test_retry_records_the_resume_on_the_new_attempt_and_marks_it_dispatched(
    harness: Harness, workspace_id: str
) -> None:
    outcomes = iter([RuntimeError("first visit fails"), None])

    def flaky(ctx: Any) -> None:
        outcome = next(outcomes)
        if outcome is not None:
            raise outcome

    harness.tasks.register("flaky_once", flaky)
    run_id = await _run(
        harness,
        workspace_id,
        {"type": "task", "name": "t", "handler": "flaky_once", "retry": {"maxAttempts": 1}},
    )
    await harness.wait_for_status(run_id, "FAILED")
    await harness.rt.pool.execute("UPDATE workflow_runs SET dispatched_at = NULL WHERE id = $1", run_id)
    row = await commands.retry_run(harness.rt, workspace_id, run_id)

    assert row["status"] == "RUNNING" and row["error"] is None
    dispatched = await harness.rt.pool.fetchval(
        "SELECT dispatched_at FROM workflow_runs WHERE id = $1", run_id
    )
    assert dispatched is not None  # the sweep waits its grace period before dispatching it again
    (resumed,) = [e for e in await harness.events(run_id) if e["event_type"] == "WORKFLOW_RESUMED"]
    assert resumed["payload"] == {"reason": "retry", "stepName": "t"}
    assert resumed["step_run_id"] == row["current_step_run_id"]
    await harness.wait_for_status(run_id, "COMPLETED")


async def test_pause_and_resume_of_the_wrong_status_say_the_status_and_what_to_do(
    harness: Harness, workspace_id: str
) -> None:
    """`pause` of a WAITING run names WAITING; `resume` of a CANCELLED run says it has ended, and
    does not talk about signalType (there is no signal a cancelled run could take)."""
    run_id = await _run(harness, workspace_id, {"type": "wait", "name": "w", "durationMs": 60_000})
    await harness.wait_for_status(run_id, "WAITING")
    with pytest.raises(InvalidStateTransition) as waiting:
        await commands.pause_run(harness.rt, workspace_id, run_id)
    assert waiting.value.message.startswith("Only a RUNNING run can be paused; this run is WAITING")
    assert "cancel" in waiting.value.message
    assert waiting.value.details == {"workflowRunId": run_id, "status": "WAITING"}

    await commands.cancel_run(harness.rt, workspace_id, run_id)
    with pytest.raises(InvalidStateTransition) as cancelled:
        await commands.resume_run(harness.rt, workspace_id, run_id, None, None)
    assert "CANCELLED" in cancelled.value.message and "has ended" in cancelled.value.message
    assert "signalType" not in cancelled.value.message
    assert cancelled.value.details == {"workflowRunId": run_id, "status": "CANCELLED"}
