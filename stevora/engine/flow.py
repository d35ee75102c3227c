"""Flow control at the claim: concurrency slots and priorities (docs/flow-control.md).

`claim` is what a worker does with a message "look at run X". The common case is one statement
(`transitions.claim`, whose fence refuses a run that needs a slot or is outranked; the claims
of concurrent messages share one, `transitions.claim_batch`, stevora.engine.claim_batch).
Otherwise:

* X is PENDING and an unclaimed run of a higher (aged) priority waits: that run is claimed
  instead and X is dispatched again, so under a backlog every message starts the best run there
  is, whatever order the broker delivers in;
* X needs a slot (a concurrency key, a workspace limit): one transaction takes the advisory
  locks, claims X if a slot is free and X is at the head of its key's queue, else marks X queued.
  A queued run holds no lease, message or worker: whoever frees a slot dispatches it;
* X gave a slot up (it ended, or waits without holding its slot) and dispatched itself for this:
  under the same locks, the head of its queue is dispatched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import asyncpg
import structlog

from stevora.db import concurrency, transitions
from stevora.db.reads.rows import DbRow
from stevora.db.runs import FlowColumns
from stevora.definitions.flow import Concurrency, key_paths
from stevora.errors import ConflictError, ValidationError
from stevora.templating import MISSING, lookup, render_template

if TYPE_CHECKING:
    from stevora.definitions import WorkflowDefinitionSpec
    from stevora.settings import Settings

log = structlog.get_logger("stevora.flow")

Claimed = tuple[DbRow, dict[str, Any] | None]


async def claim(
    pool: asyncpg.Pool, run_id: str, owner: str, lease_s: float, *, fast: bool = True
) -> tuple[tuple[str, Claimed] | None, list[str]]:
    """(the run claimed and what the claim returned, or None when neither X nor a run that
    outranks it is ours to take; the runs to dispatch now). `fast=False`: the fast statement
    was already made and refused X (a batch of claims, stevora.engine.claim_batch)."""
    if fast:
        claimed = await transitions.claim(pool, run_id, owner, lease_s)
        if claimed is not None:
            return (run_id, claimed), []
    why = await concurrency.inspect(pool, run_id)
    if why is None:
        return None, []
    if not why["runnable"]:
        # A run that gave its slot up dispatched itself: hand the slot to the head of its queue.
        return None, (await _release(pool, why) if why["frees_slot"] else [])
    if why["outranked"]:
        better = await concurrency.best_pending(pool, run_id)
        if better is not None:
            got, more = await _claim_ignoring_rank(pool, better, owner, lease_s)
            if got is not None:
                log.info("run_outranked", workflow_run_id=run_id, claimed_instead=better)
                return (better, got), [run_id, *more]
    got, more = await _claim_ignoring_rank(pool, run_id, owner, lease_s)
    return (None if got is None else (run_id, got)), more


async def _release(pool: asyncpg.Pool, why: DbRow) -> list[str]:
    async with pool.acquire() as conn, conn.transaction():
        await concurrency.lock_slots(
            conn, why["workspace_id"], why["concurrency_key"], why["workspace_limit"] is not None
        )
        return await concurrency.next_of(conn, why)


async def _claim_ignoring_rank(
    pool: asyncpg.Pool, run_id: str, owner: str, lease_s: float
) -> tuple[Claimed | None, list[str]]:
    why = await concurrency.inspect(pool, run_id)
    if why is None or not why["runnable"]:
        return None, []
    if not why["needs_slot"]:
        return await transitions.claim_plain(pool, run_id, owner, lease_s), []
    async with pool.acquire() as conn, conn.transaction():
        await concurrency.lock_slots(
            conn, why["workspace_id"], why["concurrency_key"], why["workspace_limit"] is not None
        )
        claimed = await transitions.claim_with_slot(conn, run_id, owner, lease_s)
        if claimed is None:
            await concurrency.mark_queued(conn, run_id)
            log.info("run_queued", workflow_run_id=run_id, concurrency_key=why["concurrency_key"])
            return None, []
        await concurrency.clear_queued(conn, run_id)
        # With a limit above 1, the runs queued behind this one may have a slot too.
        more = await concurrency.next_of(conn, why) if (why["concurrency_limit"] or 1) > 1 else []
    return claimed, more


async def take_slot_for_retry(conn: asyncpg.Connection, run: DbRow) -> None:
    """A FAILED run retried goes straight to RUNNING: with a concurrency key (or a workspace
    limit) only if a slot is free, decided under the slot's locks (held until the retry commits);
    else a CONFLICT naming the key (retry when a run of the key ends). A thread's turn only while
    no other turn of its thread is open (one turn at a time, docs/threads.md)."""
    if run.get("thread_id") is not None and await concurrency.other_open_turn(
        conn, run["thread_id"], run["id"]
    ):
        raise ConflictError(
            "Another turn of this thread is working or queued: retry this one when it has ended",
            details={"workflowRunId": run["id"], "threadId": run["thread_id"]},
        )
    if run["concurrency_key"] is None and run["workspace_limit"] is None:
        return
    await concurrency.lock_slots(
        conn, run["workspace_id"], run["concurrency_key"], run["workspace_limit"] is not None
    )
    if not await concurrency.slot_free_now(conn, run["id"]):
        raise ConflictError(
            "No free concurrency slot to retry this run in: retry it when a run of its key ends",
            details={"workflowRunId": run["id"], "concurrencyKey": run["concurrency_key"]},
        )


def released_by_wait(run: DbRow) -> list[str]:
    """What to dispatch when `run` starts waiting: itself, if its key lets a waiting run give its
    slot up (`holdWhileWaiting: false`), so that its claim hands the slot on (`claim`); it
    queues for a slot again when it wakes."""
    if run["concurrency_key"] is None or run["concurrency_hold_waiting"]:
        return []
    return [run["id"]]


def resolve(
    settings: Settings,
    spec: WorkflowDefinitionSpec | None,
    input: dict[str, Any],
    concurrency_override: Concurrency | None,
    priority: int | None,
) -> FlowColumns:
    """A new run's flow control: the create request's concurrency and priority, else the
    definition's, and the workspace limit in force. The key is rendered from the input; a key
    that reads a field the input lacks is a VALIDATION_ERROR naming the field (nothing written)."""
    conc = concurrency_override or (spec.concurrency if spec is not None else None)
    if priority is None:
        priority = (spec.priority if spec is not None else None) or 0
    key: str | None = None
    if conc is not None:
        for path in key_paths(conc.key):
            value = lookup(input, path[1:])
            if value is MISSING or value is None or value == "":
                field = "concurrency.key" if concurrency_override is not None else "input"
                raise ValidationError.from_problems(
                    [
                        {
                            "path": ".".join(path),
                            "message": f"the concurrency key {conc.key!r} reads {'.'.join(path)}, "
                            f"which the input does not have (from {field})",
                        }
                    ]
                )
        key = render_template(conc.key, input=input, state={})
    return FlowColumns(
        concurrency_key=key,
        concurrency_limit=conc.limit if conc is not None else None,
        hold_waiting=conc.hold_while_waiting if conc is not None else True,
        workspace_limit=settings.workspace_max_running or None,
        priority=priority,
    )
