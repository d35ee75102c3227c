"""A run's fixed path: the claim that starts a PENDING run and the one-statement completion of
its last step (`stevora.db.transitions`), their guards, and the driver going on from the rows
they return instead of re-reading the run and step at every pass."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from stevora.db import checkpoints, forks, runs, transitions
from stevora.engine import commands
from stevora.errors import InvalidStateTransition, LeaseLost
from stevora.ids import new_id
from tests.conftest import Harness, create_definition

OWNER = "test-worker"


async def _pending_run(harness: Harness, workspace_id: str, *, steps: int = 1) -> str:
    """A PENDING run nobody executes (the in-process dispatcher has its pool detached)."""
    harness.tasks.register("ok", lambda ctx: {"ok": True})
    def_id = await create_definition(
        harness.rt,
        workspace_id,
        {
            "name": "fixed",
            "version": new_id("v"),
            "steps": [{"type": "task", "name": f"s{i}", "handler": "ok"} for i in range(steps)],
        },
    )
    pool, harness.dispatcher.run_pool = harness.dispatcher.run_pool, None
    try:
        run, _ = await commands.create_run(harness.rt, workspace_id, def_id)
    finally:
        harness.dispatcher.run_pool = pool
    return str(run["id"])


async def _started_run(harness: Harness, workspace_id: str) -> tuple[str, str]:
    run_id = await _pending_run(harness, workspace_id)
    claimed = await transitions.claim(harness.rt.pool, run_id, OWNER, 60)
    assert claimed is not None and claimed[1] is not None
    return run_id, claimed[1]["id"]


async def _subscribe(harness: Harness, workspace_id: str, events: list[str], *, active: bool = True) -> str:
    hook = new_id("wh")
    await harness.rt.pool.execute(
        "INSERT INTO webhooks (id, workspace_id, url, events, secret, is_active) "
        "VALUES ($1, $2, 'https://example.invalid/hook', $3, 'whsec_test', $4)",
        hook,
        workspace_id,
        events,
        active,
    )
    return hook


def _count_calls(monkeypatch: pytest.MonkeyPatch, *targets: tuple[Any, str]) -> list[str]:
    """Wrap each (module, async function) so that its calls are listed by name."""
    calls: list[str] = []
    for module, name in targets:
        real = getattr(module, name)

        async def counted(*args: Any, __real: Any = real, __name: str = name, **kw: Any) -> Any:
            calls.append(__name)
            return await __real(*args, **kw)

        monkeypatch.setattr(module, name, counted)
    return calls


async def _snapshot(harness: Harness, run_id: str) -> dict[str, Any]:
    pool = harness.rt.pool
    return {
        "run": dict(await pool.fetchrow("SELECT * FROM workflow_runs WHERE id = $1", run_id)),
        "steps": [
            dict(r)
            for r in await pool.fetch(
                "SELECT * FROM step_runs WHERE workflow_run_id = $1 ORDER BY id", run_id
            )
        ],
        "events": await harness.event_types(run_id),
        "deliveries": await pool.fetchval(
            "SELECT count(*) FROM webhook_deliveries WHERE payload->'data'->>'workflowRunId' = $1", run_id
        ),
    }


async def test_the_claim_starts_a_pending_run_and_its_first_step_in_one_statement(
    harness: Harness, workspace_id: str
) -> None:
    run_id = await _pending_run(harness, workspace_id, steps=2)
    claimed = await transitions.claim(harness.rt.pool, run_id, OWNER, 60)
    assert claimed is not None
    run, step = claimed
    assert step is not None
    assert (run["status"], run["lease_owner"], run["current_step_name"]) == ("RUNNING", OWNER, "s0")
    assert run["current_step_run_id"] == step["id"] and run["started_at"] is not None
    stored = await runs.get_step_run(harness.rt.pool, step["id"])
    assert stored is not None and dict(stored) == step
    assert (step["status"], step["step_index"], step["visit"], step["attempt"]) == ("RUNNING", 0, 1, 1)
    assert step["started_at"] is not None
    events = await harness.events(run_id)
    assert [(e["sequence"], e["event_type"], e["step_run_id"]) for e in events] == [
        (1, "WORKFLOW_STARTED", None),
        (2, "STEP_STARTED", step["id"]),
    ]
    assert events[1]["payload"] == {"stepName": "s0", "stepType": "task", "attempt": 1, "visit": 1}
    assert await harness.rt.pool.fetchval("SELECT event_seq FROM workflow_runs WHERE id = $1", run_id) == 2


async def test_a_claim_of_a_leased_run_writes_nothing_and_of_a_started_run_starts_nothing(
    harness: Harness, workspace_id: str
) -> None:
    run_id, step_run_id = await _started_run(harness, workspace_id)
    before = await _snapshot(harness, run_id)
    assert await transitions.claim(harness.rt.pool, run_id, "someone-else", 60) is None
    assert await _snapshot(harness, run_id) == before
    # The lease expires: the next claim takes it over but the run is RUNNING, so no second start.
    await harness.rt.pool.execute(
        "UPDATE workflow_runs SET lease_expires_at = now() - interval '1 second' WHERE id = $1", run_id
    )
    again = await transitions.claim(harness.rt.pool, run_id, "someone-else", 60)
    assert again is not None and again[1] is None
    assert (again[0]["status"], again[0]["lease_owner"]) == ("RUNNING", "someone-else")
    after = await _snapshot(harness, run_id)
    assert after["steps"] == before["steps"] and after["events"] == before["events"]
    assert after["run"]["current_step_run_id"] == step_run_id


async def test_completion_writes_step_run_events_and_outbox_together(
    harness: Harness, workspace_id: str
) -> None:
    hook = await _subscribe(harness, workspace_id, ["workflow.completed"])
    await _subscribe(harness, workspace_id, ["workflow.failed"])  # not subscribed to this event
    await _subscribe(harness, workspace_id, ["workflow.completed"], active=False)
    run_id, step_run_id = await _started_run(harness, workspace_id)
    await harness.rt.pool.execute(
        'UPDATE workflow_runs SET state = \'{"kept": 1, "over": 1}\', total_cost_cents = 2.5 WHERE id = $1',
        run_id,
    )
    final = await transitions.complete_last_step(
        harness.rt.pool, run_id, step_run_id, OWNER, {"answer": 42}, {"over": 2}
    )
    assert (final["status"], final["lease_owner"], final["current_step_name"]) == ("COMPLETED", None, None)
    assert final["state"] == final["output"] == {"kept": 1, "over": 2}
    step = await runs.get_step_run(harness.rt.pool, step_run_id)
    assert step is not None and (step["status"], step["output"]) == ("COMPLETED", {"answer": 42})
    events = await harness.events(run_id)
    assert [(e["sequence"], e["event_type"]) for e in events] == [
        (1, "WORKFLOW_STARTED"),
        (2, "STEP_STARTED"),
        (3, "STEP_COMPLETED"),
        (4, "WORKFLOW_COMPLETED"),
    ]
    assert events[2]["payload"]["stepName"] == "s0" and events[2]["payload"]["durationMs"] >= 0
    assert final["event_seq"] == 4
    deliveries = await harness.rt.pool.fetch(
        "SELECT * FROM webhook_deliveries WHERE workspace_id = $1", workspace_id
    )
    assert [d["webhook_id"] for d in deliveries] == [hook]
    payload = deliveries[0]["payload"]
    assert (deliveries[0]["event"], deliveries[0]["status"], payload["event"]) == (
        "workflow.completed",
        "PENDING",
        "workflow.completed",
    )
    assert payload["data"] == {
        "workflowRunId": run_id,
        "status": "COMPLETED",
        "output": {"kept": 1, "over": 2},
        "totalCostCents": 2.5,
    }


async def test_completion_without_state_updates_keeps_the_state_as_the_output(
    harness: Harness, workspace_id: str
) -> None:
    run_id, step_run_id = await _started_run(harness, workspace_id)
    await harness.rt.pool.execute("UPDATE workflow_runs SET state = '{\"a\": 1}' WHERE id = $1", run_id)
    final = await transitions.complete_last_step(harness.rt.pool, run_id, step_run_id, OWNER, {}, None)
    assert final["status"] == "COMPLETED" and final["state"] == final["output"] == {"a": 1}


@pytest.mark.parametrize(
    "change",
    [
        "UPDATE workflow_runs SET lease_owner = 'taken-over' WHERE id = $1",  # lease lost
        "UPDATE workflow_runs SET status = 'PAUSED' WHERE id = $1",  # paused, lease still ours
        "UPDATE workflow_runs SET status = 'CANCELLED', lease_owner = NULL WHERE id = $1",  # cancelled
    ],
)
async def test_completion_under_a_lost_lease_writes_nothing(
    harness: Harness, workspace_id: str, change: str
) -> None:
    await _subscribe(harness, workspace_id, ["workflow.completed"])
    run_id, step_run_id = await _started_run(harness, workspace_id)
    await harness.rt.pool.execute(change, run_id)
    before = await _snapshot(harness, run_id)
    with pytest.raises(LeaseLost):
        await transitions.complete_last_step(harness.rt.pool, run_id, step_run_id, OWNER, {"x": 1}, {"y": 1})
    after = await _snapshot(harness, run_id)
    assert after == before
    assert after["steps"][0]["status"] == "RUNNING" and after["deliveries"] == 0


async def test_completion_racing_a_pause_writes_nothing(harness: Harness, workspace_id: str) -> None:
    """The pause commits while the completion waits for the run's row lock: the guard re-checks
    the locked row, so neither the step nor the run is completed (a guard reading the
    statement's snapshot would have completed the step of a paused run)."""
    run_id, step_run_id = await _started_run(harness, workspace_id)
    async with harness.rt.pool.acquire() as conn:
        pause = conn.transaction()
        await pause.start()
        await conn.execute("UPDATE workflow_runs SET status = 'PAUSED' WHERE id = $1", run_id)
        completing = asyncio.create_task(
            transitions.complete_last_step(harness.rt.pool, run_id, step_run_id, OWNER, {"x": 1}, None)
        )
        await asyncio.sleep(0.3)
        assert not completing.done()  # waiting for the row lock
        await pause.commit()
    with pytest.raises(LeaseLost):
        await completing
    after = await _snapshot(harness, run_id)
    assert after["run"]["status"] == "PAUSED" and after["steps"][0]["status"] == "RUNNING"
    assert after["events"] == ["WORKFLOW_STARTED", "STEP_STARTED"]


async def test_completion_of_a_step_no_longer_running_writes_nothing(
    harness: Harness, workspace_id: str
) -> None:
    run_id, step_run_id = await _started_run(harness, workspace_id)
    await harness.rt.pool.execute("UPDATE step_runs SET status = 'FAILED' WHERE id = $1", step_run_id)
    before = await _snapshot(harness, run_id)
    with pytest.raises(InvalidStateTransition):
        await transitions.complete_last_step(harness.rt.pool, run_id, step_run_id, OWNER, {"x": 1}, None)
    assert await _snapshot(harness, run_id) == before
    assert before["run"]["status"] == "RUNNING"


async def test_start_under_someone_elses_lease_writes_nothing(harness: Harness, workspace_id: str) -> None:
    run_id = await _pending_run(harness, workspace_id)
    await harness.rt.pool.execute(
        "UPDATE workflow_runs SET lease_owner = 'other', lease_expires_at = now() + interval '1 minute' "
        "WHERE id = $1",
        run_id,
    )
    before = await _snapshot(harness, run_id)
    with pytest.raises(LeaseLost):
        await transitions.start(harness.rt.pool, run_id, OWNER, 60)
    assert await _snapshot(harness, run_id) == before


async def test_an_llm_run_reads_nothing_back_on_its_fixed_path(
    harness: Harness, workspace_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No re-read of the run or step, no load of committed rounds for a fresh visit and no read of
    whether the run replays a recording (the claim returns it): the driver goes on from the rows
    its statements return."""
    reads = _count_calls(
        monkeypatch,
        (runs, "get_run"),
        (runs, "get_step_run"),
        (checkpoints, "load_rounds"),
        (forks, "replay_source"),
    )

    async def noop(input: dict[str, Any]) -> dict[str, bool]:
        return {"ok": True}

    harness.tools.register("noop", noop, description="does nothing", parameters={"type": "object"})
    def_id = await create_definition(
        harness.rt,
        workspace_id,
        {
            "name": "agent",
            "version": "1",
            "steps": [
                {
                    "type": "llm",
                    "name": "agent",
                    "model": "scripted:rounds=3",
                    "maxToolRounds": 5,
                    "messages": [{"role": "user", "content": "go"}],
                    "tools": ["noop"],
                    "outputKey": "answer",
                }
            ],
        },
    )
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id)
    row = await harness.wait_for_status(run["id"], "COMPLETED", "FAILED")
    assert row["status"] == "COMPLETED" and "answer" in row["output"]
    assert reads == []
    assert await harness.event_types(run["id"]) == [
        "WORKFLOW_STARTED",
        "STEP_STARTED",
        *["LLM_CALL_COMPLETED", "TOOL_CALL_COMPLETED"] * 3,
        "LLM_CALL_COMPLETED",
        "STEP_COMPLETED",
        "WORKFLOW_COMPLETED",
    ]
    assert row["lease_owner"] is None


async def test_a_multi_step_run_goes_on_from_returned_rows_with_each_steps_state(
    harness: Harness, workspace_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each step is inserted RUNNING by the transaction that completes the one before, and sees
    the state that step merged (from the row that transaction returned, not a re-read)."""
    reads = _count_calls(monkeypatch, (runs, "get_run"), (runs, "get_step_run"))
    seen: list[dict[str, Any]] = []

    async def count(ctx: Any) -> dict[str, Any]:
        seen.append(dict(ctx.workflow_state))
        return {"status": "completed", "output": {}, "stateUpdates": {ctx.step_name: len(seen)}}

    harness.tasks.register("count", count)
    def_id = await create_definition(
        harness.rt,
        workspace_id,
        {
            "name": "three",
            "version": "1",
            "steps": [{"type": "task", "name": f"s{i}", "handler": "count"} for i in range(3)],
        },
    )
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id)
    row = await harness.wait_for_status(run["id"], "COMPLETED", "FAILED")
    assert row["status"] == "COMPLETED" and row["output"] == {"s0": 1, "s1": 2, "s2": 3}
    assert seen == [{}, {"s0": 1}, {"s0": 1, "s1": 2}]
    assert reads == []
    events = await harness.events(run["id"])
    assert [(e["event_type"], e["payload"].get("stepName")) for e in events] == [
        ("WORKFLOW_STARTED", None),
        *[(t, f"s{i}") for i in range(3) for t in ("STEP_STARTED", "STEP_COMPLETED")],
        ("WORKFLOW_COMPLETED", None),
    ]
    assert [e["sequence"] for e in events] == list(range(1, len(events) + 1))
    steps = await harness.rt.pool.fetch(
        "SELECT status, started_at, completed_at FROM step_runs WHERE workflow_run_id = $1", run["id"]
    )
    assert len(steps) == 3
    assert all(s["status"] == "COMPLETED" and s["started_at"] <= s["completed_at"] for s in steps)
