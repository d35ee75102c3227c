"""Retention on real PostgreSQL: finished runs older than the cut-off go with everything that
belongs to them; live runs, recent runs and trees with a live member stay."""

from __future__ import annotations

import asyncio
import sys
from datetime import timedelta
from typing import Any

import pytest

from stevora.db.retention import prune_finished_runs
from stevora.engine import commands as service
from stevora.engine.steps.approval import decide_approval
from stevora.ids import new_id
from tests.conftest import Harness, create_definition

OWNED_TABLES = ("workflow_events", "step_runs", "llm_calls", "tool_trace", "approval_requests")
TOOL = {
    "name": "lookup",
    "description": "Look a thing up",
    "parameters": {"type": "object", "properties": {}},
}


async def _counts(harness: Harness, run_id: str) -> dict[str, int]:
    out = {}
    for table in ("workflow_runs", *OWNED_TABLES):
        column = "id" if table == "workflow_runs" else "workflow_run_id"
        out[table] = await harness.rt.pool.fetchval(
            f"SELECT count(*) FROM {table} WHERE {column} = $1", run_id
        )
    return out


async def _age(harness: Harness, run_id: str, days: int) -> None:
    """Pretend the run finished (and was created) `days` ago."""
    await harness.rt.pool.execute(
        "UPDATE workflow_runs SET created_at = created_at - make_interval(days => $2), "
        "completed_at = completed_at - make_interval(days => $2), failed_at = failed_at - make_interval(days => $2), "
        "cancelled_at = cancelled_at - make_interval(days => $2), updated_at = updated_at - make_interval(days => $2) "
        "WHERE id = $1",
        run_id,
        days,
    )


async def _child(conn: Any, parent_id: str, status: str, days: int) -> str:
    parent = await conn.fetchrow("SELECT * FROM workflow_runs WHERE id = $1", parent_id)
    child_id = new_id("wfrun")
    await conn.execute(
        "INSERT INTO workflow_runs (id, workspace_id, definition_id, status, parent_run_id, completed_at, "
        "updated_at) VALUES ($1, $2, $3, $4::text, $5, CASE WHEN $4::text = 'COMPLETED' THEN now() END, now())",
        child_id,
        parent["workspace_id"],
        parent["definition_id"],
        status,
        parent_id,
    )
    await conn.execute(
        "UPDATE workflow_runs SET completed_at = completed_at - make_interval(days => $2), "
        "updated_at = updated_at - make_interval(days => $2) WHERE id = $1",
        child_id,
        days,
    )
    return child_id


@pytest.fixture
async def runs(harness: Harness, workspace_id: str) -> dict[str, str]:
    """An old completed LLM+tool run, an old rejected approval run, a live (waiting) old run, and a
    recent completed run."""
    harness.tools.register("lookup", lambda input: {"found": True})
    harness.tasks.register("draft", lambda ctx: {"status": "completed", "stateUpdates": {"draft": "v1"}})
    agent = await create_definition(harness.rt, workspace_id, {
        "name": new_id("agent"), "version": "1",
        "steps": [{"type": "llm", "name": "agent", "model": "scripted", "tools": [TOOL],
                   "messages": [{"role": "user", "content": "go"}]}],
    })  # fmt: skip
    review = await create_definition(harness.rt, workspace_id, {
        "name": new_id("review"), "version": "1",
        "steps": [{"type": "task", "name": "write", "handler": "draft"},
                  {"type": "approval", "name": "review", "contentKey": "draft"}],
    })  # fmt: skip
    out: dict[str, str] = {}
    for name, definition_id in (
        ("old_llm", agent),
        ("recent", agent),
        ("old_rejected", review),
        ("live", review),
    ):
        run, _ = await service.create_run(harness.rt, workspace_id, definition_id, {})
        out[name] = run["id"]
    await harness.wait_for_status(out["old_llm"], "COMPLETED")
    await harness.wait_for_status(out["recent"], "COMPLETED")
    for name in ("old_rejected", "live"):
        await harness.wait_for_status(out[name], "WAITING")
    approval = await harness.rt.pool.fetchval(
        "SELECT id FROM approval_requests WHERE workflow_run_id = $1", out["old_rejected"]
    )
    await decide_approval(harness.rt, workspace_id, approval, "rejected")
    await harness.wait_for_status(out["old_rejected"], "FAILED")
    for name in ("old_llm", "old_rejected", "live"):
        await _age(harness, out[name], 40)
    return out


async def test_old_finished_runs_are_deleted_with_everything_that_belongs_to_them(
    harness: Harness, runs: dict[str, str]
) -> None:
    before = await _counts(harness, runs["old_llm"])
    assert all(before[t] > 0 for t in ("workflow_events", "step_runs", "llm_calls", "tool_trace")), before
    assert (await _counts(harness, runs["old_rejected"]))["approval_requests"] == 1
    live_before = await _counts(harness, runs["live"])

    assert (
        await prune_finished_runs(harness.rt.pool, timedelta(days=30), None, batch_size=1, dry_run=True) >= 2
    )
    assert (await _counts(harness, runs["old_llm"]))["workflow_runs"] == 1  # dry run deletes nothing

    deleted = await prune_finished_runs(harness.rt.pool, timedelta(days=30), None, batch_size=1)
    assert deleted >= 2
    for name in ("old_llm", "old_rejected"):
        assert set((await _counts(harness, runs[name])).values()) == {0}, name
    assert await _counts(harness, runs["live"]) == live_before  # WAITING: untouched, however old
    assert (await _counts(harness, runs["recent"]))["workflow_runs"] == 1  # finished too recently
    assert await prune_finished_runs(harness.rt.pool, timedelta(days=30), None) == 0


async def test_status_filter_limits_what_is_pruned(harness: Harness, runs: dict[str, str]) -> None:
    assert await prune_finished_runs(harness.rt.pool, timedelta(days=30), ["COMPLETED"], batch_size=10) >= 1
    assert (await _counts(harness, runs["old_llm"]))["workflow_runs"] == 0
    assert (await _counts(harness, runs["old_rejected"]))["workflow_runs"] == 1
    with pytest.raises(ValueError, match="statuses"):
        await prune_finished_runs(harness.rt.pool, timedelta(days=30), ["RUNNING"])


async def test_children_go_with_their_finished_parent_and_a_live_child_keeps_the_tree(
    harness: Harness, runs: dict[str, Any]
) -> None:
    pool = harness.rt.pool
    parent = runs["old_llm"]
    finished_child = await _child(pool, parent, "COMPLETED", 40)
    grandchild = await _child(pool, finished_child, "COMPLETED", 40)
    other_parent = runs["old_rejected"]
    live_child = await _child(pool, other_parent, "RUNNING", 40)
    tree = [parent, finished_child, grandchild, other_parent, live_child]

    deleted = await prune_finished_runs(pool, timedelta(days=30), None, batch_size=1)
    remaining = {
        r["id"] for r in await pool.fetch("SELECT id FROM workflow_runs WHERE id = ANY($1::text[])", tree)
    }
    # The finished tree went whole (3 runs); the tree with a live child stayed whole.
    assert remaining == {other_parent, live_child}
    assert deleted >= 3  # older runs of earlier tests in this database go too
    assert await pool.fetchval("SELECT count(*) FROM tool_trace WHERE workflow_run_id = $1", parent) == 0
    # A finished child is never pruned on its own while its parent is live.
    await pool.execute("UPDATE workflow_runs SET status = 'COMPLETED' WHERE id = $1", live_child)
    await pool.execute("UPDATE workflow_runs SET status = 'RUNNING' WHERE id = $1", other_parent)
    await prune_finished_runs(pool, timedelta(days=30), None)
    assert await pool.fetchval("SELECT count(*) FROM workflow_runs WHERE id = $1", live_child) == 1


async def test_runs_prune_command_dry_run_then_deletes(
    harness: Harness, runs: dict[str, str], database_url: str
) -> None:
    async def prune(*args: str) -> str:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "from stevora.cli import main; main()", "runs", "prune", *args,
            "--database-url", database_url,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        out, _ = await proc.communicate()
        assert proc.returncode == 0, out.decode()
        return out.decode()

    assert "would delete" in await prune("--older-than", "30d", "--status", "FAILED", "--dry-run")
    assert (await _counts(harness, runs["old_rejected"]))["workflow_runs"] == 1
    assert "deleted" in await prune("--older-than", "30d", "--status", "FAILED")
    assert (await _counts(harness, runs["old_rejected"]))["workflow_runs"] == 0
    assert (await _counts(harness, runs["old_llm"]))["workflow_runs"] == 1  # COMPLETED: not asked for
