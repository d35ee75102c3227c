"""Flow control in SQL: concurrency-key slots, the workspace-wide limit, and priority claims.

A run *needs a slot* to start (PENDING) or to wake (WAITING, when its key lets a waiting run
give its slot up) if it has a concurrency key or a workspace limit. A run *holds* a slot while
it is RUNNING, while WAITING or PAUSED if its key keeps the slot of a waiting run, and while a
worker holds its lease. There is no slot counter to drift: the slots in use are counted from the
runs themselves, so a run that ends, fails or is cancelled frees its slot in the very
transaction that ends it, and a killed worker's run holds its slot only until it is resumed.

Race-freedom: every claim that takes a slot runs in a transaction that first takes the advisory
lock of its workspace (with a workspace limit) and then of its key, always in that order, and
counts in a statement after the lock, so it sees every slot taken by a claim that held the lock
before it. A run that finds no slot is marked `queued_at` in the same transaction; the recovery
sweep leaves queued runs alone. A run that gives a slot up (ends, or waits without holding it)
dispatches itself after the commit; its claim finds it holds no slot and, under the same locks,
dispatches the head of its queue (`next_of`): under the locks, so a run queued by a claim that
counted the ending run as running is seen. The sweep's `dispatch_startable` is the backstop.

Order within a key: priority (higher first), then creation (FIFO). A run may start when the
slots held plus the pending runs ahead of it are fewer than the limit.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from stevora.db.runs import RUNNABLE

# Effective priority = priority + minutes waited (PRIORITY_AGING_S seconds per point): a run of
# priority 0 waiting 10 minutes outranks a fresh run of priority 9, so none starves.
PRIORITY_AGING_S = 60

_ACTIVE = "('PENDING', 'RUNNING', 'WAITING', 'PAUSED')"


def holds(o: str) -> str:
    return (
        f"({o}.status IN ('RUNNING', 'PAUSED') OR ({o}.status = 'WAITING' AND ({o}.concurrency_hold_waiting "
        f"OR ({o}.lease_owner IS NOT NULL AND {o}.lease_expires_at > now()))))"
    )


def queued_or_pending(o: str) -> str:
    return f"({o}.status = 'PENDING' OR ({o}.status = 'WAITING' AND {o}.queued_at IS NOT NULL))"


def needs_slot(w: str) -> str:
    return (
        f"(({w}.concurrency_key IS NOT NULL OR {w}.workspace_limit IS NOT NULL) AND ({w}.status = 'PENDING' "
        f"OR ({w}.status = 'WAITING' AND NOT {w}.concurrency_hold_waiting)))"
    )


def _ahead(o: str, w: str) -> str:
    return (
        f"({queued_or_pending(o)} AND ({o}.priority > {w}.priority OR ({o}.priority = {w}.priority "
        f"AND ({o}.created_at, {o}.id) < ({w}.created_at, {w}.id))))"
    )


def slot_free(w: str) -> str:
    """The run `w` may take a slot now: its key's slots held plus the runs queued ahead of it are
    fewer than its limit, and the workspace's slots held are fewer than the workspace limit."""
    return f"""(
  ({w}.concurrency_key IS NULL OR (
    SELECT count(*) FROM workflow_runs o
    WHERE o.workspace_id = {w}.workspace_id AND o.concurrency_key = {w}.concurrency_key
      AND o.status IN {_ACTIVE} AND o.id <> {w}.id AND ({holds("o")} OR {_ahead("o", w)})
  ) < {w}.concurrency_limit)
  AND ({w}.workspace_limit IS NULL OR (
    SELECT count(*) FROM workflow_runs o
    WHERE o.workspace_id = {w}.workspace_id AND o.status IN {_ACTIVE} AND o.id <> {w}.id AND {holds("o")}
  ) < {w}.workspace_limit)
)"""


def _effective(r: str) -> str:
    return f"({r}.priority + extract(epoch FROM now() - {r}.created_at) / {PRIORITY_AGING_S})"


def outranked(w: str) -> str:
    """A PENDING run `w` for which an unclaimed, unqueued PENDING run of a higher priority and a
    higher effective (aged) priority waits. Uses the partial index of raised priorities."""
    return f"""({w}.status = 'PENDING' AND EXISTS (
  SELECT 1 FROM workflow_runs b
  WHERE b.status = 'PENDING' AND b.priority > 0 AND b.priority > {w}.priority AND b.queued_at IS NULL
    AND (b.lease_owner IS NULL OR b.lease_expires_at < now()) AND {_effective("b")} > {_effective(w)}
))"""


def turn_ready(w: str) -> str:
    """A PENDING turn of a thread starts only when no older turn of its thread is open: one turn
    at a time, in order (docs/threads.md). True for every other run. An index lookup
    (`ix_runs_thread_created`), not a concurrency slot: no advisory lock, no slot queue."""
    return (
        f"({w}.thread_id IS NULL OR {w}.status <> 'PENDING' OR NOT EXISTS ("
        f"SELECT 1 FROM workflow_runs t WHERE t.thread_id = {w}.thread_id "
        "AND t.status IN ('PENDING', 'RUNNING', 'WAITING', 'PAUSED') "
        f"AND (t.created_at, t.id) < ({w}.created_at, {w}.id)))"
    )


# The fast path's extra fence (stevora.db.transitions): no slot needed, not outranked, a thread's
# turn only when its turn has come.
FAST_FENCE = f"NOT {needs_slot('w')} AND NOT {outranked('w')} AND {turn_ready('w')}"
# The fence of a claim that takes a slot (under the advisory locks).
SLOT_FENCE = f"{needs_slot('w')} AND {slot_free('w')}"
# A claim that ignores rank (the outranked run was tried first, or is gone).
PLAIN_FENCE = f"NOT {needs_slot('w')} AND {turn_ready('w')}"

_W = (
    RUNNABLE.replace("status", "w.status")
    .replace("lease_", "w.lease_")
    .replace("next_run_at", "w.next_run_at")
)

_INSPECT_SQL = f"""
SELECT w.id, w.workspace_id, w.concurrency_key, w.concurrency_limit, w.workspace_limit,
       {needs_slot("w")} AS needs_slot, {outranked("w")} AS outranked, {_W} AS runnable,
       (w.concurrency_key IS NOT NULL OR w.workspace_limit IS NOT NULL) AND NOT {holds("w")} AS frees_slot
FROM workflow_runs w WHERE w.id = $1
"""

_BEST_SQL = f"""
SELECT b.id FROM workflow_runs b
WHERE b.status = 'PENDING' AND b.priority > 0 AND b.queued_at IS NULL
  AND (b.lease_owner IS NULL OR b.lease_expires_at < now()) AND b.id <> $1
ORDER BY {_effective("b")} DESC, b.created_at, b.id
LIMIT 1
"""


async def inspect(pool: asyncpg.Pool, run_id: str) -> asyncpg.Record | None:
    """Why the fast path refused a run: `runnable` (else nobody may claim it now), `needs_slot`,
    `outranked`, and `frees_slot` (it has a key or a workspace limit and holds no slot)."""
    return await pool.fetchrow(_INSPECT_SQL, run_id)


async def best_pending(pool: asyncpg.Pool, other_than: str) -> str | None:
    """The unclaimed PENDING run of the highest effective priority (raised priorities only)."""
    found: str | None = await pool.fetchval(_BEST_SQL, other_than)
    return found


async def lock_slots(conn: asyncpg.Connection, workspace_id: str, key: str | None, limited: bool) -> None:
    """The advisory locks of a slot decision: the workspace's first, then the key's (one order
    for everybody, so two deciders never deadlock). Held until the transaction ends."""
    if limited:
        await conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended('stevora-ws:' || $1, 0))", workspace_id
        )
    if key is not None:
        await conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended('stevora-key:' || $1 || ':' || $2, 0))",
            workspace_id,
            key,
        )


async def other_open_turn(conn: asyncpg.Connection, thread_id: str, run_id: str) -> bool:
    """Whether a turn of the thread other than `run_id` has not ended."""
    found = await conn.fetchval(
        "SELECT 1 FROM workflow_runs WHERE thread_id = $1 AND id <> $2 "
        "AND status IN ('PENDING', 'RUNNING', 'WAITING', 'PAUSED') LIMIT 1",
        thread_id,
        run_id,
    )
    return found is not None


async def slot_free_now(conn: asyncpg.Connection, run_id: str) -> bool:
    """Whether the run could take a slot now (call under `lock_slots`)."""
    free: bool = await conn.fetchval(f"SELECT {slot_free('w')} FROM workflow_runs w WHERE w.id = $1", run_id)
    return free


async def mark_queued(conn: asyncpg.Connection, run_id: str) -> None:
    await conn.execute(
        f"UPDATE workflow_runs w SET queued_at = COALESCE(w.queued_at, now()) "
        f"WHERE w.id = $1 AND {needs_slot('w')}",
        run_id,
    )


async def clear_queued(conn: asyncpg.Connection, run_id: str) -> None:
    await conn.execute(
        "UPDATE workflow_runs SET queued_at = NULL WHERE id = $1 AND queued_at IS NOT NULL", run_id
    )


# The runs that may start once a slot of this run's key (or workspace) is free: the pending and
# queued runs at the head of the key's queue (or of the workspace's), up to `$4` of them. Read in
# the ending's transaction, so the ending run no longer counts; a dispatch is only a hint (the
# claim decides under the lock), so a few too many cost a refused claim each.
_NEXT_SQL = f"""
SELECT o.id FROM workflow_runs o
WHERE o.workspace_id = $1 AND o.id <> $3 AND {queued_or_pending("o")}
  AND ($2::text IS NULL OR o.concurrency_key = $2)
  AND (o.lease_owner IS NULL OR o.lease_expires_at < now())
  AND (o.concurrency_key IS NOT NULL OR o.workspace_limit IS NOT NULL)
ORDER BY o.priority DESC, o.created_at, o.id
LIMIT $4
"""

WAKE_AT_MOST = 10


async def next_of(conn: asyncpg.Connection | asyncpg.Pool, run: Any) -> list[str]:
    """The runs to dispatch now that `run` (its key, its workspace) gave a slot up."""
    if run["concurrency_key"] is None and run["workspace_limit"] is None:
        return []
    key = run["concurrency_key"] if run["workspace_limit"] is None else None
    limit = min(run["concurrency_limit"] or WAKE_AT_MOST, WAKE_AT_MOST)
    rows = await conn.fetch(_NEXT_SQL, run["workspace_id"], key, run["id"], limit)
    return [r["id"] for r in rows]


# The sweep's backstop: queued runs that could start now (a dispatch lost, a worker killed between
# an ending and its dispatch), marked dispatched so several sweepers do not all send them.
_STARTABLE_SQL = f"""
UPDATE workflow_runs SET dispatched_at = now()
WHERE id IN (
    SELECT w.id FROM workflow_runs w
    WHERE w.queued_at IS NOT NULL AND {_W} AND {SLOT_FENCE}
      AND (w.dispatched_at IS NULL OR w.dispatched_at < now() - make_interval(secs => $1))
    ORDER BY w.priority DESC, w.created_at, w.id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
RETURNING id
"""


async def dispatch_startable(pool: asyncpg.Pool, grace_s: float, limit: int = 500) -> list[str]:
    rows = await pool.fetch(_STARTABLE_SQL, grace_s, limit)
    return [r["id"] for r in rows]


_POSITION_SQL = f"""
SELECT count(*) + 1 FROM workflow_runs o, workflow_runs w
WHERE w.id = $1 AND o.workspace_id = w.workspace_id AND o.id <> w.id
  AND o.concurrency_key IS NOT DISTINCT FROM w.concurrency_key AND {_ahead("o", "w")}
"""


async def queue_position(conn: asyncpg.Connection | asyncpg.Pool, run_id: str) -> int:
    """1 for the head of its key's queue (for the API and the UI)."""
    position: int = await conn.fetchval(_POSITION_SQL, run_id)
    return position
