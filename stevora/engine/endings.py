"""Every terminal transition of a run: completed, failed, cancelled.

Each function runs inside the caller's transaction and writes the run's final status, its event
and its webhook outbox row together. This is the one place a run ends, so it is also where a
run's ending is announced to whoever waits for it: a child run started by a workflow tool writes
its parent's tool result here (stevora.engine.steps.awaited.workflow), a `map` step's child run its
item's result (stevora.engine.steps.map), and a cancelled run cancels its
active children. Each returns an `Ended`: the final row and the runs to dispatch once the
caller's transaction has committed (a parent its ending woke, a map's next items, and a run that
frees a concurrency slot, whose claim then dispatches the runs queued for it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import asyncpg
import structlog

from stevora.db import approvals, runs, threads, transitions
from stevora.db.group_commit import GroupCommitter
from stevora.db.outbox import enqueue_webhooks
from stevora.db.reads.rows import DbRow
from stevora.db.runs import RELEASE
from stevora.engine import map_recorder
from stevora.engine.hints import dispatch_hint
from stevora.engine.steps import map as map_step
from stevora.engine.steps.awaited import workflow as workflow_calls
from stevora.events import Event, EventType, WebhookEvent
from stevora.observability.metrics import RUNS_FINISHED
from stevora.statuses import ACTIVE_RUN_STATUSES, RunStatus

if TYPE_CHECKING:
    from stevora.runtime import Runtime

log = structlog.get_logger("stevora.engine")


@dataclass(frozen=True, slots=True)
class Ended:
    """A run that ended: its final row, and the runs to dispatch after the commit."""

    run: DbRow
    dispatch: tuple[str, ...] = ()

    @property
    def map_parent(self) -> str | None:
        """The parent run whose `map` item this run's ending ended: its worker records the ending
        on the parent after the commit (`stevora.engine.map_recorder`)."""
        return self.run["parent_run_id"] if is_map_child(self.run) else None


async def complete_run(
    conn: asyncpg.Connection, run_id: str, *, owner: str, events: Sequence[Event] = ()
) -> Ended:
    """RUNNING → COMPLETED. The run's output is its final state (documented in docs/concepts.md)."""
    final: DbRow = await runs.update_run(
        conn,
        run_id,
        expect=[RunStatus.RUNNING],
        owner=owner,
        sets={"status": RunStatus.COMPLETED, "current_step_name": None, "next_run_at": None, **RELEASE},
        now_columns=["completed_at"],
        output_from_state=True,
        events=[*events, Event(EventType.WORKFLOW_COMPLETED, {})],
    )
    await enqueue_webhooks(
        conn,
        final["workspace_id"],
        WebhookEvent.WORKFLOW_COMPLETED,
        {
            "workflowRunId": run_id,
            "status": RunStatus.COMPLETED,
            "output": final["state"],
            "totalCostCents": final["total_cost_cents"],
        },
    )
    log.info("run_completed", workflow_run_id=run_id)
    RUNS_FINISHED.labels(RunStatus.COMPLETED).inc()
    return await _announced(conn, final)


async def complete_with_last_step(
    db: GroupCommitter | asyncpg.Connection,
    run: DbRow,
    step_run_id: str,
    *,
    owner: str,
    output: dict[str, Any],
    state_updates: dict[str, Any] | None,
) -> Ended:
    """The last step RUNNING → COMPLETED and the run RUNNING → COMPLETED, its events and its
    webhook outbox rows in one statement (`transitions.complete_last_step`). A run whose ending
    `announces` nothing passes the group committer: runs ending together share that statement and
    its commit. A run with a parent told in its ending's transaction (a workflow tool call), a
    concurrency slot or a thread passes a connection in a transaction: in that transaction its
    ending then answers its parent or ends its turn, and its slot's queue is woken after the
    commit."""
    final: DbRow = await transitions.complete_last_step(
        db, run["id"], step_run_id, owner, output, state_updates
    )
    log.info("run_completed", workflow_run_id=run["id"])
    RUNS_FINISHED.labels(RunStatus.COMPLETED).inc()
    if not announces(final):
        return Ended(final)
    assert isinstance(db, asyncpg.Connection), "a parent is told in the ending's transaction"
    return await _announced(db, final)


async def fail_run(
    conn: asyncpg.Connection,
    run_id: str,
    error: dict[str, Any],
    *,
    owner: str,
    events: Sequence[Event] = (),
    expect: Sequence[str] = (RunStatus.RUNNING,),
) -> Ended:
    """RUNNING (or `expect`) → FAILED with `error` (retryable later by `commands.retry_run`)."""
    final: DbRow = await runs.update_run(
        conn,
        run_id,
        expect=expect,
        owner=owner,
        sets={"status": RunStatus.FAILED, "error": error, "next_run_at": None, **RELEASE},
        now_columns=["failed_at"],
        events=[*events, Event(EventType.WORKFLOW_FAILED, {"error": error})],
    )
    await enqueue_webhooks(
        conn,
        final["workspace_id"],
        WebhookEvent.WORKFLOW_FAILED,
        {"workflowRunId": run_id, "status": RunStatus.FAILED, "error": error},
    )
    log.info("run_failed", workflow_run_id=run_id, code=error.get("code"))
    RUNS_FINISHED.labels(RunStatus.FAILED).inc()
    return await _announced(conn, final)


async def cancel_run(
    conn: asyncpg.Connection, run_id: str, *, tell_parent: bool = True, reason: str | None = None
) -> Ended:
    """Any active status → CANCELLED; open steps, pending approvals and active child runs are
    cancelled with it. Children are locked and cancelled before their parent: the same order a
    child's own ending takes (child, then parent), so the two never deadlock. A `reason` (a
    thread turn `interrupted` by a new message) goes in the event and the run's `error`."""
    dispatch: list[str] = []
    for child_id in await runs.active_children(conn, run_id):
        child = await cancel_run(conn, child_id, tell_parent=False)
        dispatch += child.dispatch
        if child.run["parent_tool_call_id"] is None:  # a map item's child: the item says so too
            await map_step.record_cancelled_with_parent(conn, child.run)
    cancelled_steps = await runs.cancel_open_steps(conn, run_id)
    await approvals.cancel_for_run(conn, run_id)
    final: DbRow = await runs.update_run(
        conn,
        run_id,
        expect=ACTIVE_RUN_STATUSES,
        sets={
            "status": RunStatus.CANCELLED,
            "next_run_at": None,
            **RELEASE,
            **(
                {"error": {"code": "CANCELLED", "reason": reason, "message": f"Cancelled: {reason}"}}
                if reason
                else {}
            ),
        },
        now_columns=["cancelled_at"],
        events=[
            Event(
                EventType.WORKFLOW_CANCELLED,
                {"cancelledStepRuns": cancelled_steps, **({"reason": reason} if reason else {})},
            )
        ],
    )
    await enqueue_webhooks(
        conn,
        final["workspace_id"],
        WebhookEvent.WORKFLOW_CANCELLED,
        {"workflowRunId": run_id, "status": RunStatus.CANCELLED},
    )
    log.info("run_cancelled", workflow_run_id=run_id)
    RUNS_FINISHED.labels(RunStatus.CANCELLED).inc()
    if tell_parent:
        dispatch += await _tell_parent(conn, final)
    dispatch += await _end_turn(conn, final)
    return Ended(final, (*dispatch, *_queue_wake(final)))


async def _announced(conn: asyncpg.Connection, final: DbRow) -> Ended:
    """The ended run's parent told (or its thread), and what to dispatch after the commit."""
    turn = await _end_turn(conn, final)
    return Ended(final, (*await _tell_parent(conn, final), *turn, *_queue_wake(final)))


async def _end_turn(conn: asyncpg.Connection, final: DbRow) -> list[str]:
    """A thread's turn ended: its state is the thread's and the next queued turn's, and that
    turn is dispatched after the commit (its claim starts it: no older turn is open now)."""
    if final.get("thread_id") is None:
        return []
    return await threads.turn_ended(conn, final["thread_id"], final["id"], final["state"])


def _queue_wake(final: DbRow) -> list[str]:
    # The ended run dispatches itself: its claim, after this commit and under the slot's advisory
    # locks, dispatches the runs queued for the slot (stevora.engine.flow.claim).
    return [final["id"]] if needs_queue_wake(final) else []


def announces(run: DbRow) -> bool:
    """Whether the run's ending does more than its own statement, in a transaction around it:
    answer a workflow tool call, wake a slot's queue, end a thread's turn (and start the next). A
    `map` item's child does not: its statement ends its item too (migration 0028's trigger)."""
    return run["parent_tool_call_id"] is not None or needs_queue_wake(run) or run.get("thread_id") is not None


def is_map_child(run: DbRow) -> bool:
    """A child run started by a `map` step for an item (not by a workflow tool call)."""
    return run["parent_run_id"] is not None and run["parent_tool_call_id"] is None


async def after_commit(rt: Runtime, ended: Ended) -> None:
    """Once an ending's transaction has committed: dispatch the runs it woke and, for a `map`
    item's child, have this process record the ending on the parent."""
    parent = ended.map_parent
    if parent is not None or ended.dispatch:
        rt.faults.reached("parent_told")
    for run_id in ended.dispatch:
        await dispatch_hint(rt.dispatcher, run_id)
    if parent is not None:
        map_recorder.poke(rt, parent)


def needs_queue_wake(run: DbRow) -> bool:
    """Whether the run's ending frees a slot that runs may be queued for."""
    return run["concurrency_key"] is not None or run["workspace_limit"] is not None


async def _tell_parent(conn: asyncpg.Connection, final: DbRow) -> list[str]:
    """Answer the call or item that started the ended run; returns the runs to dispatch."""
    if final["parent_run_id"] is None:
        return []
    if final["parent_tool_call_id"] is not None:  # started by a workflow tool call
        return await workflow_calls.answer_from_child(conn, final)
    return await map_step.answer_from_child(conn, final)  # started by a `map` step for an item
