"""The `map` step over real child runs (in-process workers, real claims and leases): order, the
concurrency bound, exactly one child per item, `continue` vs `fail`, cancel cascade, retry of the
failed items only, bad items and the item limit."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from stevora.db import map_items, runs
from stevora.engine import commands
from stevora.engine.sweep import sweep_once
from stevora.ids import new_id
from stevora.settings import Settings
from tests.conftest import Harness, create_definition


async def _child_workflow(harness: Harness, workspace_id: str, handler: str) -> str:
    name = new_id("item")
    await create_definition(
        harness.rt,
        workspace_id,
        {"name": name, "version": "1", "steps": [{"type": "task", "name": "work", "handler": handler}]},
    )
    return name


async def _start(harness: Harness, workspace_id: str, child: str, tickets: Any, **map_fields: Any) -> str:
    spec = {
        "name": new_id("fanout"),
        "version": "1",
        "steps": [
            {
                "type": "map",
                "name": "triage",
                "items": "{{input.tickets}}",
                "workflow": child,
                "input": {"ticket": "{{item}}", "n": "{{index}}"},
                "outputKey": "results",
                **map_fields,
            },
            {"type": "task", "name": "after", "handler": "after"},
        ],
    }
    def_id = await create_definition(harness.rt, workspace_id, spec)
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id, {"tickets": tickets})
    return str(run["id"])


def _register_after(harness: Harness) -> list[Any]:
    seen: list[Any] = []

    async def after(ctx: Any) -> None:
        seen.append(ctx.workflow_state.get("results"))

    harness.tasks.register("after", after)
    return seen


def _register_bad_ticket_fails(harness: Harness, ran: list[str]) -> None:
    """`work`: the ticket "bad" fails its child run (not retried), any other completes with it."""

    async def work(ctx: Any) -> dict[str, Any]:
        ran.append(ctx.workflow_input["ticket"])
        if ctx.workflow_input["ticket"] == "bad":
            return {
                "status": "failed",
                "error": {"code": "NOPE", "message": "bad ticket"},
                "retryable": False,
            }
        return {"status": "completed", "stateUpdates": {"t": ctx.workflow_input["ticket"]}}

    harness.tasks.register("work", work)


def _register_slow_and_broken(
    harness: Harness, release: asyncio.Event, calls: Counter[str], broken: set[str]
) -> None:
    """`work`: counts each ticket in `calls`; "slow" waits for `release`; a ticket in `broken`
    (read at each call) fails, not retried; any other completes with it."""

    async def work(ctx: Any) -> dict[str, Any]:
        ticket = ctx.workflow_input["ticket"]
        calls[ticket] += 1
        if ticket == "slow":
            await release.wait()
        if ticket in broken:
            return {"status": "failed", "error": {"code": "NOPE", "message": ticket}, "retryable": False}
        return {"status": "completed", "stateUpdates": {"t": ticket}}

    harness.tasks.register("work", work)


async def test_results_come_back_in_item_order_within_the_concurrency_bound(
    harness: Harness, workspace_id: str
) -> None:
    calls: Counter[int] = Counter()
    running = 0
    most = 0

    async def work(ctx: Any) -> dict[str, Any]:
        nonlocal running, most
        n = ctx.workflow_input["n"]
        calls[n] += 1
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.01 * ((n * 7) % 5))  # items end out of order
        running -= 1
        return {"status": "completed", "stateUpdates": {"double": ctx.workflow_input["ticket"] * 2}}

    harness.tasks.register("work", work)
    seen = _register_after(harness)
    child = await _child_workflow(harness, workspace_id, "work")
    run_id = await _start(harness, workspace_id, child, list(range(12)), concurrency=3)
    row = await harness.wait_for_status(run_id, "COMPLETED", "FAILED", timeout_s=30)

    assert row["status"] == "COMPLETED", row["error"]
    assert row["output"]["results"] == [{"double": 2 * i} for i in range(12)]
    assert seen == [row["output"]["results"]]
    assert calls == Counter(range(12))  # each item ran exactly once
    assert most <= 3
    # One child run per item, each under the parent.
    children = await harness.rt.pool.fetch(
        "SELECT input, status FROM workflow_runs WHERE parent_run_id = $1", run_id
    )
    assert sorted(c["input"]["n"] for c in children) == list(range(12))
    assert {c["status"] for c in children} == {"COMPLETED"}
    # The events never show more than `concurrency` children out at once.
    events = await harness.events(run_id)
    out = 0
    for e in events:
        if e["event_type"] == "MAP_ITEM_STARTED":
            out += 1
            assert out <= 3 and e["payload"]["running"] <= 3
        elif e["event_type"] in ("MAP_ITEM_COMPLETED", "MAP_ITEM_FAILED"):
            out -= 1
    types = [e["event_type"] for e in events]
    assert types.count("MAP_ITEM_STARTED") == 12 and types.count("MAP_ITEM_COMPLETED") == 12
    paused = next(e for e in events if e["event_type"] == "WORKFLOW_PAUSED")
    assert paused["payload"]["reason"] == "map" and paused["payload"]["map"]["total"] == 12
    resumed = next(e for e in events if e["event_type"] == "WORKFLOW_RESUMED")
    assert resumed["payload"]["reason"] == "map" and resumed["payload"]["done"] == 12
    # The children's start times confirm the bound: never more than 3 not ended at any start.
    spans = await harness.rt.pool.fetch(
        "SELECT started_at, ended_at FROM map_items WHERE workflow_run_id = $1", run_id
    )
    for s in spans:
        overlapping = [o for o in spans if o["started_at"] <= s["started_at"] < o["ended_at"]]
        assert len(overlapping) <= 3


async def test_the_parent_waits_holding_no_lease_while_children_run(
    harness: Harness, workspace_id: str
) -> None:
    release = asyncio.Event()

    async def work(ctx: Any) -> dict[str, Any]:
        await release.wait()
        return {"status": "completed", "stateUpdates": {"ok": True}}

    harness.tasks.register("work", work)
    _register_after(harness)
    child = await _child_workflow(harness, workspace_id, "work")
    run_id = await _start(harness, workspace_id, child, ["a", "b", "c"], concurrency=2)
    row = await harness.wait_for_status(run_id, "WAITING")
    assert row["lease_owner"] is None
    for _ in range(200):
        items = await harness.rt.pool.fetch(
            "SELECT status FROM map_items WHERE workflow_run_id = $1 ORDER BY item_index", run_id
        )
        if [i["status"] for i in items] == ["running", "running", "pending"]:
            break
        await asyncio.sleep(0.02)
    assert [i["status"] for i in items] == ["running", "running", "pending"]
    release.set()
    row = await harness.wait_for_status(run_id, "COMPLETED", "FAILED", timeout_s=20)
    assert row["output"]["results"] == [{"ok": True}] * 3


async def test_continue_collects_every_childs_status_output_and_error(
    harness: Harness, workspace_id: str
) -> None:
    _register_bad_ticket_fails(harness, [])
    _register_after(harness)
    child = await _child_workflow(harness, workspace_id, "work")
    run_id = await _start(
        harness, workspace_id, child, ["a", "bad", "c"], concurrency=1, onItemFailure="continue"
    )
    row = await harness.wait_for_status(run_id, "COMPLETED", "FAILED", timeout_s=30)
    assert row["status"] == "COMPLETED", row["error"]
    results = row["output"]["results"]
    assert [r["status"] for r in results] == ["COMPLETED", "FAILED", "COMPLETED"]
    assert results[0]["output"] == {"t": "a"} and results[2]["output"] == {"t": "c"}
    assert results[1]["output"] is None and results[1]["error"]["code"] == "NOPE"
    assert results[0]["error"] is None and results[2]["error"] is None
    assert all(r["childRunId"].startswith("wfrun_") for r in results)
    assert [r["index"] for r in results] == [0, 1, 2]
    types = await harness.event_types(run_id)
    assert types.count("MAP_ITEM_FAILED") == 1 and types.count("MAP_ITEM_COMPLETED") == 2


async def test_a_child_cancelled_on_its_own_is_a_cancelled_item_under_continue(
    harness: Harness, workspace_id: str
) -> None:
    """Cancelling one child run (not the parent) ends its item as cancelled, with an error that
    says so (a cancelled run has none of its own), and the map goes on with the other items."""

    async def work(ctx: Any) -> dict[str, Any]:
        if ctx.workflow_input["ticket"] == "stuck":
            await asyncio.sleep(60)
        return {"status": "completed", "stateUpdates": {"t": ctx.workflow_input["ticket"]}}

    harness.tasks.register("work", work)
    _register_after(harness)
    child = await _child_workflow(harness, workspace_id, "work")
    run_id = await _start(
        harness, workspace_id, child, ["stuck", "b"], concurrency=2, onItemFailure="continue"
    )
    stuck = await harness.value_when_set(
        "SELECT id FROM workflow_runs WHERE parent_run_id = $1 AND input->>'ticket' = 'stuck' AND status = 'RUNNING'",
        run_id,
    )
    await commands.cancel_run(harness.rt, workspace_id, stuck)
    row = await harness.wait_for_status(run_id, "COMPLETED", "FAILED", timeout_s=30)
    assert row["status"] == "COMPLETED", row["error"]
    results = row["output"]["results"]
    assert [r["status"] for r in results] == ["CANCELLED", "COMPLETED"]
    assert results[0]["error"] == {"code": "CHILD_RUN_CANCELLED", "message": "Run was cancelled"}
    assert results[0]["childRunId"] == stuck and results[1]["output"] == {"t": "b"}
    (failed,) = [e["payload"] for e in await harness.events(run_id) if e["event_type"] == "MAP_ITEM_FAILED"]
    assert failed["status"] == "CANCELLED" and failed["error"]["code"] == "CHILD_RUN_CANCELLED"


async def test_fail_stops_starting_items_and_names_the_failed_index(
    harness: Harness, workspace_id: str
) -> None:
    ran: list[str] = []
    _register_bad_ticket_fails(harness, ran)
    _register_after(harness)
    child = await _child_workflow(harness, workspace_id, "work")
    run_id = await _start(harness, workspace_id, child, ["a", "bad", "c", "d"], concurrency=1)
    row = await harness.wait_for_status(run_id, "FAILED", "COMPLETED", timeout_s=30)
    assert row["status"] == "FAILED"
    assert row["error"]["code"] == "MAP_ITEM_FAILED"
    assert "Item 1 of 4" in row["error"]["message"] and "NOPE" in row["error"]["message"]
    assert row["error"]["details"]["itemIndex"] == 1
    assert ran == ["a", "bad"]  # the items after it were never started
    statuses = await harness.rt.pool.fetch(
        "SELECT status FROM map_items WHERE workflow_run_id = $1 ORDER BY item_index", run_id
    )
    assert [s["status"] for s in statuses] == ["completed", "failed", "pending", "pending"]


async def test_retry_of_the_failed_parent_reruns_only_the_failed_items(
    harness: Harness, workspace_id: str
) -> None:
    calls: Counter[str] = Counter()
    broken = {"b", "d"}

    async def work(ctx: Any) -> dict[str, Any]:
        ticket = ctx.workflow_input["ticket"]
        calls[ticket] += 1
        if ticket in broken:
            return {"status": "failed", "error": {"code": "NOPE", "message": ticket}, "retryable": False}
        return {"status": "completed", "stateUpdates": {"t": ticket, "call": calls[ticket]}}

    harness.tasks.register("work", work)
    _register_after(harness)
    child = await _child_workflow(harness, workspace_id, "work")
    run_id = await _start(harness, workspace_id, child, ["a", "b", "c", "d", "e"], concurrency=5)
    row = await harness.wait_for_status(run_id, "FAILED", "COMPLETED", timeout_s=30)
    assert row["status"] == "FAILED"
    # Let the siblings that were still running end (they run to their end).
    for _ in range(200):
        if sum(calls.values()) == 5 and not await harness.rt.pool.fetchval(
            "SELECT count(*) FROM workflow_runs WHERE parent_run_id = $1 AND status NOT IN "
            "('COMPLETED', 'FAILED', 'CANCELLED')",
            run_id,
        ):
            break
        await asyncio.sleep(0.02)
    assert calls == Counter("abcde")

    broken.clear()
    await commands.retry_run(harness.rt, workspace_id, run_id)
    row = await harness.wait_for_status(run_id, "COMPLETED", "FAILED", timeout_s=30)
    assert row["status"] == "COMPLETED", row["error"]
    assert calls == Counter({"a": 1, "b": 2, "c": 1, "d": 2, "e": 1})
    assert row["output"]["results"] == [
        {"t": "a", "call": 1},
        {"t": "b", "call": 2},
        {"t": "c", "call": 1},
        {"t": "d", "call": 2},
        {"t": "e", "call": 1},
    ]
    children = await harness.rt.pool.fetchval(
        "SELECT count(*) FROM workflow_runs WHERE parent_run_id = $1", run_id
    )
    assert children == 7


async def test_cancelling_the_parent_cancels_its_children(harness: Harness, workspace_id: str) -> None:
    async def work(ctx: Any) -> None:
        await asyncio.sleep(60)

    harness.tasks.register("work", work)
    _register_after(harness)
    child = await _child_workflow(harness, workspace_id, "work")
    run_id = await _start(harness, workspace_id, child, ["a", "b", "c"], concurrency=2)
    await harness.wait_for_status(run_id, "WAITING")
    await harness.value_when_set(
        "SELECT count(*) = 2 FROM workflow_runs WHERE parent_run_id = $1 AND status = 'RUNNING'", run_id
    )
    await commands.cancel_run(harness.rt, workspace_id, run_id)
    row = await harness.wait_for_status(run_id, "CANCELLED")
    assert row["status"] == "CANCELLED"
    children = await harness.rt.pool.fetch(
        "SELECT status FROM workflow_runs WHERE parent_run_id = $1", run_id
    )
    assert [c["status"] for c in children] == ["CANCELLED", "CANCELLED"]  # the third never started
    # The items say what became of them, and the map counts none as running.
    items = await harness.rt.pool.fetch(
        "SELECT i.status, i.error FROM map_items i JOIN step_runs s ON s.id = i.step_run_id "
        "WHERE s.workflow_run_id = $1 ORDER BY i.item_index",
        run_id,
    )
    assert [i["status"] for i in items] == ["cancelled", "cancelled", "pending"]
    assert items[0]["error"] == {
        "code": "CHILD_RUN_CANCELLED",
        "message": "Run was cancelled with its parent",
    }
    header = await harness.rt.pool.fetchrow(
        "SELECT m.running, m.failed FROM map_steps m JOIN step_runs s ON s.id = m.step_run_id "
        "WHERE s.workflow_run_id = $1",
        run_id,
    )
    assert (header["running"], header["failed"]) == (0, 2)


@pytest.mark.parametrize(
    ("tickets", "items", "code", "needle"),
    [
        (
            "not a list",
            "{{input.tickets}}",
            "MAP_ITEMS_NOT_A_LIST",
            "items: '{{input.tickets}}' resolved to str",
        ),
        (None, "{{input.tickets}}", "MAP_ITEMS_NOT_A_LIST", "resolved to null"),
        ([1], "{{input.missing}}", "MAP_ITEMS_MISSING", "items: '{{input.missing}}' names nothing"),
    ],
)
async def test_items_that_are_not_a_list_fail_the_step_naming_the_path(
    harness: Harness, workspace_id: str, tickets: Any, items: str, code: str, needle: str
) -> None:
    harness.tasks.register("work", lambda ctx: None)
    _register_after(harness)
    child = await _child_workflow(harness, workspace_id, "work")
    run_id = await _start(harness, workspace_id, child, tickets, items=items)
    row = await harness.wait_for_status(run_id, "FAILED", "COMPLETED")
    assert row["status"] == "FAILED"
    assert row["error"]["code"] == code and needle in row["error"]["message"], row["error"]
    assert row["error"]["details"]["path"] == "items"
    assert (
        await harness.rt.pool.fetchval("SELECT count(*) FROM workflow_runs WHERE parent_run_id = $1", run_id)
        == 0
    )


async def test_an_item_template_naming_nothing_fails_naming_the_item(
    harness: Harness, workspace_id: str
) -> None:
    harness.tasks.register("work", lambda ctx: None)
    _register_after(harness)
    child = await _child_workflow(harness, workspace_id, "work")
    run_id = await _start(
        harness, workspace_id, child, [{"title": "x"}, {"nope": 1}], input={"title": "{{item.title}}"}
    )
    row = await harness.wait_for_status(run_id, "FAILED", "COMPLETED")
    assert row["error"]["code"] == "TEMPLATE_PATH_MISSING"
    assert row["error"]["message"].startswith("items[1]: input.title: '{{item.title}}' names nothing")


async def test_an_unknown_workflow_fails_the_step(harness: Harness, workspace_id: str) -> None:
    _register_after(harness)
    run_id = await _start(harness, workspace_id, "no-such-workflow", [1, 2])
    row = await harness.wait_for_status(run_id, "FAILED", "COMPLETED")
    assert row["error"]["code"] == "WORKFLOW_NOT_FOUND" and "'no-such-workflow'" in row["error"]["message"]


async def test_the_item_count_limit_is_the_setting(harness: Harness, workspace_id: str) -> None:
    limited: Settings = harness.rt.settings.model_copy(update={"map_max_items": 3})
    original = harness.rt.settings
    harness.rt.settings = limited
    try:
        harness.tasks.register("work", lambda ctx: {"status": "completed", "stateUpdates": {"ok": 1}})
        _register_after(harness)
        child = await _child_workflow(harness, workspace_id, "work")
        too_many = await _start(harness, workspace_id, child, [1, 2, 3, 4])
        row = await harness.wait_for_status(too_many, "FAILED", "COMPLETED")
        assert row["error"]["code"] == "MAP_TOO_MANY_ITEMS"
        assert "4 items, more than STEVORA_MAP_MAX_ITEMS (3)" in row["error"]["message"]
        just_enough = await _start(harness, workspace_id, child, [1, 2, 3])
        row = await harness.wait_for_status(just_enough, "FAILED", "COMPLETED", timeout_s=20)
        assert row["status"] == "COMPLETED" and row["output"]["results"] == [{"ok": 1}] * 3
    finally:
        harness.rt.settings = original


async def test_an_empty_list_completes_at_once(harness: Harness, workspace_id: str) -> None:
    seen = _register_after(harness)
    run_id = await _start(harness, workspace_id, "never-looked-up", [])
    row = await harness.wait_for_status(run_id, "COMPLETED", "FAILED")
    assert row["status"] == "COMPLETED" and row["output"]["results"] == [] and seen == [[]]


async def test_an_item_can_never_get_a_second_child_run(harness: Harness, workspace_id: str) -> None:
    harness.tasks.register("work", lambda ctx: {"status": "completed", "stateUpdates": {"ok": 1}})
    _register_after(harness)
    child = await _child_workflow(harness, workspace_id, "work")
    run_id = await _start(harness, workspace_id, child, ["a", "b"], concurrency=2)
    await harness.wait_for_status(run_id, "COMPLETED")
    step_run_id = await harness.rt.pool.fetchval(
        "SELECT step_run_id FROM map_items WHERE workflow_run_id = $1 LIMIT 1", run_id
    )
    # A start replayed over the same items (as if item 1's start had not been recorded) finds the
    # child run's unique key taken: no second child run, the item is not marked started again.
    async with harness.rt.pool.acquire() as conn, conn.transaction():
        await conn.execute(
            "UPDATE map_items SET status = 'pending' WHERE step_run_id = $1 AND item_index = 1", step_run_id
        )
        await conn.execute(
            "UPDATE map_steps SET completed = completed - 1 WHERE step_run_id = $1", step_run_id
        )
        parent = await runs.lock_run(conn, run_id)
        header = await map_items.get_map(conn, step_run_id)
        assert await map_items.start_pending(conn, parent, header, 2) == []
    assert (
        await harness.rt.pool.fetchval("SELECT count(*) FROM workflow_runs WHERE parent_run_id = $1", run_id)
        == 2
    )


async def test_a_retry_takes_over_a_child_still_running_from_the_failed_attempt(
    harness: Harness, workspace_id: str
) -> None:
    calls: Counter[str] = Counter()
    release = asyncio.Event()
    broken = {"bad"}
    _register_slow_and_broken(harness, release, calls, broken)
    _register_after(harness)
    child = await _child_workflow(harness, workspace_id, "work")
    run_id = await _start(harness, workspace_id, child, ["slow", "bad", "c"], concurrency=2)
    row = await harness.wait_for_status(run_id, "FAILED", timeout_s=30)
    assert row["error"]["details"]["itemIndex"] == 1
    assert calls == Counter({"slow": 1, "bad": 1})  # "c" never started; "slow" is still out

    broken.clear()
    await commands.retry_run(harness.rt, workspace_id, run_id)
    await harness.wait_for_status(run_id, "WAITING")
    for _ in range(250):  # the retry starts "bad" again and "c" beside the running "slow"
        if calls["bad"] == 2 and calls["c"] == 1:
            break
        await asyncio.sleep(0.02)
    release.set()
    row = await harness.wait_for_status(run_id, "COMPLETED", "FAILED", timeout_s=30)
    assert row["status"] == "COMPLETED", row["error"]
    assert row["output"]["results"] == [{"t": "slow"}, {"t": "bad"}, {"t": "c"}]
    assert calls == Counter({"slow": 1, "bad": 2, "c": 1})
    # 4 child runs in all: "slow" once (taken over by the retry), "bad" twice, "c" once.
    assert (
        await harness.rt.pool.fetchval("SELECT count(*) FROM workflow_runs WHERE parent_run_id = $1", run_id)
        == 4
    )


async def test_a_child_ending_after_its_parent_failed_keeps_its_result_and_starts_nothing(
    harness: Harness, workspace_id: str
) -> None:
    """`fail`: a sibling still out when the parent failed runs to its end; its ending writes its
    item's result (for a retry) and touches nothing else of the failed parent."""
    release = asyncio.Event()
    _register_slow_and_broken(harness, release, Counter(), {"bad"})
    _register_after(harness)
    child = await _child_workflow(harness, workspace_id, "work")
    run_id = await _start(harness, workspace_id, child, ["slow", "bad", "c"], concurrency=2)
    await harness.wait_for_status(run_id, "FAILED", timeout_s=30)
    events_then = await harness.event_types(run_id)
    release.set()
    slow = await harness.value_when_set(
        "SELECT id FROM workflow_runs WHERE parent_run_id = $1 AND input->>'ticket' = 'slow' "
        "AND status = 'COMPLETED'",
        run_id,
    )
    items = await harness.rt.pool.fetch(
        "SELECT i.status, i.output FROM map_items i JOIN step_runs s ON s.id = i.step_run_id "
        "WHERE s.workflow_run_id = $1 ORDER BY i.item_index",
        run_id,
    )
    assert [(i["status"], i["output"]) for i in items] == [
        ("completed", {"t": "slow"}),
        ("failed", None),
        ("pending", None),  # never started
    ]
    row = await harness.rt.pool.fetchrow("SELECT status FROM workflow_runs WHERE id = $1", run_id)
    assert row["status"] == "FAILED" and await harness.event_types(run_id) == events_then
    assert await harness.event_types(slow) == [
        "WORKFLOW_STARTED",
        "STEP_STARTED",
        "STEP_COMPLETED",
        "WORKFLOW_COMPLETED",
    ]


async def test_the_safety_recheck_starts_items_into_slots_no_ending_filled(
    harness: Harness, workspace_id: str
) -> None:
    """A free slot that no child's ending filled (the retry race of docs/definitions.md: a failed
    item's child ending between `execute` and the wait being written) is filled by the map's own
    re-check when its `wait_until` comes due, and the map then completes as usual."""
    release = asyncio.Event()
    started: list[str] = []

    async def work(ctx: Any) -> dict[str, Any]:
        started.append(ctx.workflow_input["ticket"])
        if ctx.workflow_input["ticket"] == "a":
            await release.wait()
        return {"status": "completed", "stateUpdates": {"t": ctx.workflow_input["ticket"]}}

    harness.tasks.register("work", work)
    _register_after(harness)
    child = await _child_workflow(harness, workspace_id, "work")
    run_id = await _start(harness, workspace_id, child, ["a", "b", "c"], concurrency=1)
    await harness.wait_for_status(run_id, "WAITING")
    for _ in range(200):
        if started == ["a"]:
            break
        await asyncio.sleep(0.02)
    assert started == ["a"]
    # Two slots free that no ending will fill (the map's slots grow as they would free in the
    # race), and the re-check due now instead of in 5 minutes.
    await harness.rt.pool.execute("UPDATE map_steps SET concurrency = 3 WHERE workflow_run_id = $1", run_id)
    await asyncio.sleep(0.3)
    assert started == ["a"]  # nothing else starts items: only the re-check can
    await harness.rt.pool.execute(
        "UPDATE step_runs SET wait_until = now() WHERE workflow_run_id = $1 AND step_name = 'triage'", run_id
    )
    await harness.rt.pool.execute("UPDATE workflow_runs SET next_run_at = now() WHERE id = $1", run_id)
    # The sweep (a worker's loop; the harness runs none) dispatches the due parent; its re-check
    # starts the children and dispatches them once its transaction has committed.
    for _ in range(100):
        await sweep_once(harness.rt)
        if sorted(started) == ["a", "b", "c"]:
            break
        await asyncio.sleep(0.1)
    assert sorted(started) == ["a", "b", "c"]  # b and c started by the re-check while a still runs
    step = await harness.rt.pool.fetchrow(
        "SELECT status, wait_until FROM step_runs WHERE workflow_run_id = $1 AND step_name = 'triage'", run_id
    )
    assert step["status"] == "WAITING" and step["wait_until"] is not None  # and it waits on
    release.set()
    row = await harness.wait_for_status(run_id, "COMPLETED", "FAILED", timeout_s=20)
    assert row["status"] == "COMPLETED", row["error"]
    assert row["output"]["results"] == [{"t": "a"}, {"t": "b"}, {"t": "c"}]
    assert started.count("b") == 1 and started.count("c") == 1


async def test_a_child_run_ends_in_the_one_statement_completion_and_its_item_hears_of_it(
    harness: Harness, workspace_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child's last step completes with its run in one statement (as a root run's does), in the
    transaction that then answers its map item: not through the step-then-run `complete_run`."""
    from stevora.db import transitions
    from stevora.engine import endings

    ended: list[str] = []
    for module, name in ((transitions, "complete_last_step"), (endings, "complete_run")):
        real = getattr(module, name)

        async def counted(*args: Any, __real: Any = real, __name: str = name, **kw: Any) -> Any:
            ended.append(__name)
            return await __real(*args, **kw)

        monkeypatch.setattr(module, name, counted)
    harness.tasks.register("work", lambda ctx: {"status": "completed", "stateUpdates": {"t": 1}})
    seen = _register_after(harness)
    child = await _child_workflow(harness, workspace_id, "work")
    run_id = await _start(harness, workspace_id, child, ["a", "b", "c"], concurrency=2)
    row = await harness.wait_for_status(run_id, "COMPLETED", "FAILED", timeout_s=30)
    assert row["status"] == "COMPLETED", row["error"]
    assert seen == [[{"t": 1}] * 3]
    # Three children and the parent: each ended through the one statement.
    assert ended == ["complete_last_step"] * 4
    children = await harness.rt.pool.fetch("SELECT id FROM workflow_runs WHERE parent_run_id = $1", run_id)
    for child_row in children:
        assert await harness.event_types(child_row["id"]) == [
            "WORKFLOW_STARTED",
            "STEP_STARTED",
            "STEP_COMPLETED",
            "WORKFLOW_COMPLETED",
        ]


async def _one_at_a_time_first_held(harness: Harness, workspace_id: str) -> tuple[str, str, asyncio.Event]:
    """A map of three items one at a time, its first child running until `release` is set:
    (parent, first child, release)."""
    release = asyncio.Event()

    async def work(ctx: Any) -> dict[str, Any]:
        await release.wait()
        return {"status": "completed", "stateUpdates": {"t": 1}}

    harness.tasks.register("work", work)
    _register_after(harness)
    child = await _child_workflow(harness, workspace_id, "work")
    run_id = await _start(harness, workspace_id, child, ["a", "b", "c"], concurrency=1)
    await harness.wait_for_status(run_id, "WAITING")
    first = await harness.value_when_set(
        "SELECT id FROM workflow_runs WHERE parent_run_id = $1 AND status = 'RUNNING'", run_id
    )
    return run_id, str(first), release


@pytest.mark.parametrize("meanwhile", ["parent_failed", "sibling_failure_counted"])
async def test_a_start_is_taken_back_at_recording_when_the_map_no_longer_wants_it(
    harness: Harness, workspace_id: str, meanwhile: str
) -> None:
    """A child's ending starts the next item without the parent's lock; recording it on the parent
    (`record_endings`, under that lock) takes the start back if the parent stopped waiting on the
    map (or a sibling's failure stopped a `fail` map) since: no child run is left for it, the item
    is pending again, the counts hold, and no start event is written."""
    run_id, first, release = await _one_at_a_time_first_held(harness, workspace_id)
    events_before = await harness.event_types(run_id)
    pool = harness.rt.pool
    async with pool.acquire() as conn:
        row = await conn.fetchrow("SELECT id, parent_run_id FROM workflow_runs WHERE id = $1", first)
        ended = await map_items.end_item(conn, row, "completed", {"t": "a"}, None)
        assert ended["ended"] == 1 and ended["started_child"] is not None  # slot passed on
        started = ended["started_child"]
        # Committed before the ending is recorded.
        if meanwhile == "parent_failed":
            await conn.execute("UPDATE workflow_runs SET status = 'FAILED' WHERE id = $1", run_id)
        else:
            await conn.execute("UPDATE map_steps SET failed = 1 WHERE workflow_run_id = $1", run_id)
        assert await map_items.record_endings(conn, run_id) == (
            [] if meanwhile == "parent_failed" else [run_id]
        )
        assert await map_items.record_endings(conn, run_id) == []  # recorded once
    assert await pool.fetchval("SELECT count(*) FROM workflow_runs WHERE id = $1", started) == 0
    items = await pool.fetch(
        "SELECT status, child_run_id, passed_to, unrecorded FROM map_items WHERE workflow_run_id = $1 "
        "ORDER BY item_index",
        run_id,
    )
    assert [(i["status"], i["child_run_id"], i["unrecorded"]) for i in items] == [
        ("completed", first, False),
        ("pending", None, False),
        ("pending", None, False),
    ]
    assert items[0]["passed_to"] == 1
    header = await pool.fetchrow(
        "SELECT running, completed FROM map_steps WHERE workflow_run_id = $1", run_id
    )
    assert (header["running"], header["completed"]) == (0, 1)
    if meanwhile == "parent_failed":  # nobody waits on the map: counted only, no event
        assert await harness.event_types(run_id) == events_before
    else:  # the item's ending is told, the start is not; and the map is due (failed fast)
        assert await harness.event_types(run_id) == [*events_before, "MAP_ITEM_COMPLETED"]
    release.set()  # the child's own ending now finds its item written: nothing more happens
    await harness.wait_for_status(first, "COMPLETED")
    assert await pool.fetchval("SELECT count(*) FROM workflow_runs WHERE parent_run_id = $1", run_id) == 1


async def test_endings_are_recorded_in_one_batch_with_gapless_events(
    harness: Harness, workspace_id: str
) -> None:
    """Children ending while nobody records (as if every worker's recording were slow) are each
    ended in their own statement, their slots passed on; one recording then writes all their events
    (each ending followed by the start it passed its slot to), with gapless sequence numbers and the
    progress counted up event by event, and dispatches the children started."""
    harness.tasks.register("work", lambda ctx: {"status": "completed", "stateUpdates": {"t": 1}})
    _register_after(harness)
    child = await _child_workflow(harness, workspace_id, "work")
    pool = harness.rt.pool
    # Recordings in this process do nothing (the sweep would find them after its grace period).
    harness.rt.map_recorder = _Deaf()
    run_id = await _start(harness, workspace_id, child, list(range(6)), concurrency=3)
    await harness.value_when_set(
        "SELECT count(*) = 3 FROM map_items WHERE workflow_run_id = $1 AND unrecorded", run_id
    )
    before = await pool.fetchval("SELECT event_seq FROM workflow_runs WHERE id = $1", run_id)
    woken = await map_items.record_endings(pool, run_id)
    assert len(woken) == 3  # the three children started in the freed slots, PENDING until dispatched
    assert {
        r["status"] for r in await pool.fetch("SELECT status FROM workflow_runs WHERE id = ANY($1)", woken)
    } == {"PENDING"}
    events = await harness.events(run_id)
    batch = [e for e in events if e["sequence"] > before]
    assert [e["sequence"] for e in batch] == list(range(before + 1, before + 7))
    assert [e["event_type"] for e in batch] == ["MAP_ITEM_COMPLETED", "MAP_ITEM_STARTED"] * 3
    assert [e["payload"]["done"] for e in batch] == [1, 1, 2, 2, 3, 3]
    assert all(e["payload"]["running"] == 3 for e in batch[1::2])
    assert [e["payload"]["childRunId"] for e in batch[1::2]] == woken
    header = await pool.fetchrow(
        "SELECT running, completed FROM map_steps WHERE workflow_run_id = $1", run_id
    )
    assert (header["running"], header["completed"]) == (3, 3)


async def test_an_ending_whose_worker_died_before_recording_it_is_recorded_by_the_sweep(
    harness: Harness, workspace_id: str
) -> None:
    """The worker that committed a child's ending dies before recording it on the parent (here: its
    recordings do nothing): the sweep finds the unrecorded endings once the grace period is over,
    records them and dispatches what that starts; the map completes, each item run once, and the
    parent's timeline is gapless with every `MAP_ITEM_*` event."""
    calls: Counter[int] = Counter()

    async def work(ctx: Any) -> dict[str, Any]:
        calls[ctx.workflow_input["n"]] += 1
        return {"status": "completed", "stateUpdates": {"n": ctx.workflow_input["n"]}}

    # A task name of its own: the sweep below also dispatches what earlier tests of this database
    # left PENDING (e.g. the gapless-events test's started children), which must not run `work`.
    harness.tasks.register("work_swept", work)
    _register_after(harness)
    child = await _child_workflow(harness, workspace_id, "work_swept")
    pool = harness.rt.pool
    harness.rt.map_recorder = _Deaf()
    run_id = await _start(harness, workspace_id, child, list(range(4)), concurrency=2)
    await harness.value_when_set(
        "SELECT count(*) = 2 FROM map_items WHERE workflow_run_id = $1 AND unrecorded", run_id
    )
    # Within the grace period an ending is its worker's to record; past it, the sweep's.
    assert run_id not in await map_items.parents_with_unrecorded(pool, 3600, 1000)
    assert run_id in await map_items.parents_with_unrecorded(pool, 0, 1000)
    for _ in range(200):
        # The grace period over (for the test: the endings aged), the sweep records them.
        await pool.execute("UPDATE map_items SET ended_at = ended_at - interval '1 hour' WHERE unrecorded")
        await sweep_once(harness.rt)
        row = await pool.fetchrow("SELECT status, output FROM workflow_runs WHERE id = $1", run_id)
        if row["status"] == "COMPLETED":
            break
        await asyncio.sleep(0.05)
    assert row["status"] == "COMPLETED"
    assert row["output"]["results"] == [{"n": n} for n in range(4)]
    assert calls == Counter(range(4))
    events = await harness.events(run_id)
    assert [e["sequence"] for e in events] == list(range(1, len(events) + 1))
    types = [e["event_type"] for e in events]
    assert types.count("MAP_ITEM_STARTED") == 4 and types.count("MAP_ITEM_COMPLETED") == 4


async def _endings_stranded(
    harness: Harness, workspace_id: str, tickets: list[Any], concurrency: int
) -> tuple[str, list[Any]]:
    """A map whose children complete at once, in a process whose recordings do nothing (a worker
    that died after each ending's commit), once its first `concurrency` endings are in:
    (parent, what its `after` step saw)."""
    harness.tasks.register("work", lambda ctx: {"status": "completed", "stateUpdates": {"t": 1}})
    seen = _register_after(harness)
    child = await _child_workflow(harness, workspace_id, "work")
    harness.rt.map_recorder = _Deaf()
    run_id = await _start(harness, workspace_id, child, tickets, concurrency=concurrency)
    await harness.value_when_set(
        "SELECT count(*) = $2 FROM map_items WHERE workflow_run_id = $1 AND unrecorded", run_id, concurrency
    )
    return run_id, seen


async def test_the_parents_recheck_records_endings_first_and_never_completes_past_an_unrecorded_one(
    harness: Harness, workspace_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Endings nobody recorded yet: the parent's due re-check does not complete the map past them
    (their events would be lost), and it records them itself before it looks at the items, so it
    then completes with every `MAP_ITEM_*` event on the timeline."""
    run_id, seen = await _endings_stranded(harness, workspace_id, ["a", "b"], concurrency=2)
    pool = harness.rt.pool

    async def due_now_until(query: str) -> Any:
        await pool.execute(
            "UPDATE step_runs SET wait_until = now() WHERE workflow_run_id = $1 AND step_name = 'triage'",
            run_id,
        )
        await pool.execute("UPDATE workflow_runs SET next_run_at = now() WHERE id = $1", run_id)
        for _ in range(100):  # the parent dispatched (not the sweep: it records endings too)
            await harness.rt.dispatcher.dispatch(run_id)
            if value := await pool.fetchval(query, run_id):
                return value
            await asyncio.sleep(0.1)
        raise AssertionError(query)

    real = map_items.record_endings

    async def recording_lost(conn: Any, parent_run_id: str) -> list[str]:
        return []

    monkeypatch.setattr(map_items, "record_endings", recording_lost)
    # Waits on (the re-check set its next wake-up) instead of completing.
    await due_now_until(
        "SELECT wait_until > now() + interval '1 minute' FROM step_runs "
        "WHERE workflow_run_id = $1 AND step_name = 'triage'"
    )
    assert (await pool.fetchrow("SELECT status FROM workflow_runs WHERE id = $1", run_id))[
        "status"
    ] == "WAITING"
    monkeypatch.setattr(map_items, "record_endings", real)
    await due_now_until("SELECT status = 'COMPLETED' FROM workflow_runs WHERE id = $1")
    row = await harness.wait_for_status(run_id, "COMPLETED", "FAILED", timeout_s=20)
    assert row["status"] == "COMPLETED", row["error"]
    assert seen == [[{"t": 1}, {"t": 1}]]
    types = await harness.event_types(run_id)
    assert types.count("MAP_ITEM_COMPLETED") == 2 and types.count("MAP_ITEM_STARTED") == 2
    assert types.index("MAP_ITEM_COMPLETED") < types.index("STEP_COMPLETED")


async def _due_and_dispatched(harness: Harness, run_id: str) -> None:
    """The map's re-check due now (not in 5 minutes), and the parent dispatched."""
    await harness.rt.pool.execute(
        "UPDATE step_runs SET wait_until = now() WHERE workflow_run_id = $1 AND step_name = 'triage'", run_id
    )
    await harness.rt.pool.execute("UPDATE workflow_runs SET next_run_at = now() WHERE id = $1", run_id)
    await harness.rt.dispatcher.dispatch(run_id)


async def test_a_recording_committed_during_the_recheck_is_not_postponed_by_it(
    harness: Harness, workspace_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parent's re-check looks at its items and finds the map not done; the last ending's
    recording (a child's worker) then commits, making the wait due, and its dispatch of the parent
    is lost (the parent is leased by the re-check). The re-check looks again under the locks and
    completes the map, instead of pushing the wait 5 minutes out."""
    run_id, seen = await _endings_stranded(harness, workspace_id, ["a", "b"], concurrency=2)
    pool = harness.rt.pool

    real_record, real_items = map_items.record_endings, map_items.items
    interleaved: list[str] = []

    async def record_endings(conn: Any, parent_run_id: str) -> list[str]:
        if not interleaved:  # the re-check's first recording finds nothing: the child's recorder has them
            return []
        return await real_record(conn, parent_run_id)

    async def items_then_recorded(conn: Any, step_run_id: str, limit: int | None = None) -> list[Any]:
        rows = await real_items(conn, step_run_id, limit)
        if not interleaved:  # between the re-check's look and its lock: the recording commits
            interleaved.append(step_run_id)
            assert await real_record(pool, run_id) == [run_id]  # due; its dispatch lost
        return rows

    monkeypatch.setattr(map_items, "record_endings", record_endings)
    monkeypatch.setattr(map_items, "items", items_then_recorded)
    await _due_and_dispatched(harness, run_id)
    row = await harness.wait_for_status(run_id, "COMPLETED", "FAILED", timeout_s=10)
    assert row["status"] == "COMPLETED", row["error"]
    assert interleaved and seen == [[{"t": 1}, {"t": 1}]]
    types = await harness.event_types(run_id)
    assert types.count("MAP_ITEM_COMPLETED") == 2


async def test_children_started_by_the_recheck_recording_are_dispatched_at_once(
    harness: Harness, workspace_id: str
) -> None:
    """Endings nobody recorded passed their slots on to children runs nobody dispatched; the
    parent's re-check records them and dispatches those children at once (not after the sweep's
    grace period: no sweep runs here)."""
    run_id, _ = await _endings_stranded(harness, workspace_id, ["a", "b", "c", "d"], concurrency=2)
    pool = harness.rt.pool
    started = [
        r["id"]
        for r in await pool.fetch(
            "SELECT id FROM workflow_runs WHERE parent_run_id = $1 AND status = 'PENDING'", run_id
        )
    ]
    assert len(started) == 2
    await asyncio.sleep(0.2)
    assert all(run not in [sent for sent, _ in harness.dispatcher.sent] for run in started)
    await _due_and_dispatched(harness, run_id)
    for run in started:
        assert (await harness.wait_for_status(run, "COMPLETED", timeout_s=10))["status"] == "COMPLETED"


async def test_a_parent_whose_recording_fails_stops_no_other_in_the_sweep(
    harness: Harness, workspace_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep records the stranded endings of each parent on its own: one whose recording
    raises is logged and left for the next round; the others are recorded, and the rest of the
    round (due runs dispatched) happens."""
    run_id, _ = await _endings_stranded(harness, workspace_id, ["a", "b"], concurrency=2)
    pool = harness.rt.pool
    await pool.execute("UPDATE map_items SET ended_at = ended_at - interval '1 hour' WHERE unrecorded")
    real_parents, real_record = map_items.parents_with_unrecorded, map_items.record_endings

    async def with_a_broken_one(pool: Any, older_than_s: float, limit: int) -> list[str]:
        return ["wfrun_broken", *await real_parents(pool, older_than_s, limit)]

    async def record_endings(conn: Any, parent_run_id: str) -> list[str]:
        if parent_run_id == "wfrun_broken":
            raise ValueError("a row this recording cannot take")
        return await real_record(conn, parent_run_id)

    monkeypatch.setattr(map_items, "parents_with_unrecorded", with_a_broken_one)
    monkeypatch.setattr(map_items, "record_endings", record_endings)
    # A run the same round dispatches: PENDING, never dispatched (input: an empty list to map).
    lost = await pool.fetchval(
        "INSERT INTO workflow_runs (id, workspace_id, definition_id, status, input, dispatched_at) "
        "SELECT $2, workspace_id, definition_id, 'PENDING', '{\"tickets\": []}'::jsonb, "
        "now() - interval '1 hour' FROM workflow_runs WHERE id = $1 RETURNING id",
        run_id,
        new_id("wfrun"),
    )
    ids = await sweep_once(harness.rt)
    assert run_id in ids and lost in ids  # recorded (due: the map is done), and dispatched
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM map_items WHERE workflow_run_id = $1 AND unrecorded", run_id
        )
        == 0
    )
    row = await harness.wait_for_status(run_id, "COMPLETED", "FAILED", timeout_s=10)
    assert row["status"] == "COMPLETED", row["error"]


async def test_a_child_started_for_a_parent_cancelled_since_is_taken_back_not_dispatched_by_the_sweep(
    harness: Harness, workspace_id: str
) -> None:
    """A child's ending starts the next item (a PENDING child run) while its parent is being
    cancelled, and the worker dies before recording it. The sweep records the stranded ending
    before it dispatches runs nobody dispatched, so the start is taken back (the parent no longer
    waits) instead of being dispatched and claimed under a cancelled parent."""
    run_id, first, release = await _one_at_a_time_first_held(harness, workspace_id)
    pool = harness.rt.pool
    async with pool.acquire() as conn:
        row = await conn.fetchrow("SELECT id, parent_run_id FROM workflow_runs WHERE id = $1", first)
        started = (await map_items.end_item(conn, row, "completed", {"t": "a"}, None))["started_child"]
    assert started is not None
    # The parent cancelled meanwhile (the cascade did not see the new child), and the grace
    # period over for both the ending and the undispatched child.
    await pool.execute("UPDATE workflow_runs SET status = 'CANCELLED' WHERE id = $1", run_id)
    await pool.execute("UPDATE map_items SET ended_at = ended_at - interval '1 hour' WHERE unrecorded")
    await pool.execute(
        "UPDATE workflow_runs SET dispatched_at = now() - interval '1 hour' WHERE id = $1", started
    )
    ids = await sweep_once(harness.rt)
    assert started not in ids and started not in [sent for sent, _ in harness.dispatcher.sent]
    assert await pool.fetchval("SELECT count(*) FROM workflow_runs WHERE id = $1", started) == 0
    assert (
        await pool.fetchval(
            "SELECT status FROM map_items WHERE workflow_run_id = $1 AND item_index = 1", run_id
        )
        == "pending"
    )
    release.set()
    await harness.wait_for_status(first, "COMPLETED")


async def test_the_sweep_records_a_stranded_ending_before_its_started_child_counts_as_undispatched(
    harness: Harness, workspace_id: str
) -> None:
    """The sweep records endings stranded for half the undispatched grace period, so the child run
    an ending started is recorded (or taken back) before any worker's sweep could find it
    undispatched (it was started in the ending's statement, `dispatched_at` = the ending's time)."""
    from stevora.engine import map_recorder

    run_id, _ = await _endings_stranded(harness, workspace_id, ["a", "b", "c"], concurrency=1)
    pool = harness.rt.pool
    grace = harness.rt.settings.undispatched_grace_s
    await pool.execute(
        "UPDATE map_items SET ended_at = now() - make_interval(secs => $2) WHERE workflow_run_id = $1 AND unrecorded",
        run_id,
        grace * 0.7,
    )
    woken = await map_recorder.record_stranded(harness.rt)
    assert len(woken) == 1  # the child the ending started, dispatched by the recording
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM map_items WHERE workflow_run_id = $1 AND unrecorded", run_id
        )
        == 0
    )


class _Deaf:
    """A map recorder that records nothing: a worker that died right after an ending's commit."""

    def poke(self, parent_run_id: str) -> None:
        pass

    async def close(self) -> None:
        pass
