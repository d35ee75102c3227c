"""Threads and the messages sent to running llm steps, as the engine writes them (docs/threads.md).

A thread's turns are workflow runs whose `thread_id` names it, each started only when the turns
before it have ended (`stevora.db.concurrency.turn_ready`); a `steer` message is a `run_messages` row, pending until
the step injects it at a round boundary. The API's reads are `stevora.db.reads.threads`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg

from stevora.ids import new_id

THREAD_COLUMNS = (
    "id, workspace_id, definition_id, metadata, state, on_active, forked_from_run_id, created_at, updated_at"
)
# A turn that has not ended (the first of them, oldest first, is the active one).
_OPEN = "status IN ('PENDING', 'RUNNING', 'WAITING', 'PAUSED')"


def concurrency_key(thread_id: str) -> str:
    """The concurrency override a turn is created with, so the definition's own key does not
    apply; `make_turn` clears it in the same transaction (turns queue by the claim's fence,
    `stevora.db.concurrency.turn_ready`). Turns from before that change still hold it."""
    return f"thread:{thread_id}"


async def insert_thread(
    conn: asyncpg.Connection | asyncpg.Pool,
    *,
    workspace_id: str,
    definition_id: str,
    metadata: dict[str, Any],
    state: dict[str, Any],
    on_active: str,
    forked_from_run_id: str | None = None,
) -> asyncpg.Record | None:
    """A new thread; None when the definition is not the workspace's (checked in the statement)."""
    return await conn.fetchrow(
        f"INSERT INTO threads (id, workspace_id, definition_id, metadata, state, on_active, forked_from_run_id) "
        f"SELECT $1, $2::text, d.id, $4, $5, $6, $7 FROM workflow_definitions d "
        f"WHERE d.id = $3 AND d.workspace_id = $2 RETURNING {THREAD_COLUMNS}",
        new_id("thr"),
        workspace_id,
        definition_id,
        metadata,
        state,
        on_active,
        forked_from_run_id,
    )


async def lock_thread(conn: asyncpg.Connection, workspace_id: str, thread_id: str) -> asyncpg.Record | None:
    """The thread, locked for this transaction (messages to one thread are decided one at a time)."""
    return await conn.fetchrow(
        f"SELECT {THREAD_COLUMNS} FROM threads WHERE id = $1 AND workspace_id = $2 FOR UPDATE",
        thread_id,
        workspace_id,
    )


async def open_turns(conn: asyncpg.Connection, thread_id: str) -> list[asyncpg.Record]:
    """The thread's turns that have not ended, oldest first (the first is the active one)."""
    rows: list[asyncpg.Record] = await conn.fetch(
        f"SELECT id, status FROM workflow_runs WHERE thread_id = $1 AND {_OPEN} ORDER BY created_at, id",
        thread_id,
    )
    return rows


async def make_turn(conn: asyncpg.Connection, run_id: str, thread_id: str, state: dict[str, Any]) -> None:
    """A just-inserted run becomes the thread's turn, starting from the thread's state. It holds
    no concurrency key (created with the thread's, so the definition's own does not apply): the
    claim starts a turn only when no older turn of its thread is open
    (`stevora.db.concurrency.turn_ready`), and the turn before it dispatches it as it ends."""
    await conn.execute(
        "UPDATE workflow_runs SET thread_id = $2, state = $3, concurrency_key = NULL, concurrency_limit = NULL "
        "WHERE id = $1",
        run_id,
        thread_id,
        state,
    )


async def turn_ended(conn: asyncpg.Connection, thread_id: str, run_id: str, state: Any) -> list[str]:
    """The ended turn's state becomes the thread's and the starting state of the turns queued
    behind it (not started yet); messages still pending for the run are discarded. Returns the
    next turn to dispatch once this commits: the thread's oldest open turn, if it has not started
    (a turn holding the key `thread:<id>`, from before turns held none, is dispatched by its
    slot's release instead: harmless twice)."""
    await conn.execute(
        "UPDATE threads SET state = COALESCE($2::jsonb, '{}'::jsonb), updated_at = now() WHERE id = $1",
        thread_id,
        state,
    )
    await conn.execute(
        "UPDATE workflow_runs SET state = COALESCE($2::jsonb, '{}'::jsonb) "
        "WHERE thread_id = $1 AND status = 'PENDING' AND started_at IS NULL",
        thread_id,
        state,
    )
    await conn.execute(
        "UPDATE run_messages SET status = 'discarded' WHERE workflow_run_id = $1 AND status = 'pending'",
        run_id,
    )
    following = await conn.fetchrow(
        f"SELECT id, status FROM workflow_runs WHERE thread_id = $1 AND id <> $2 AND {_OPEN} "
        "ORDER BY created_at, id LIMIT 1",
        thread_id,
        run_id,
    )
    return [following["id"]] if following is not None and following["status"] == "PENDING" else []


async def delete_thread(conn: asyncpg.Connection, workspace_id: str, thread_id: str) -> asyncpg.Record | None:
    return await conn.fetchrow(
        f"DELETE FROM threads WHERE id = $1 AND workspace_id = $2 RETURNING {THREAD_COLUMNS}",
        thread_id,
        workspace_id,
    )


async def previous_turn(
    db: asyncpg.Pool | asyncpg.Connection, thread_id: str, run_id: str, step_name: str
) -> str | None:
    """The latest turn before `run_id` whose step `step_name` committed a model call: the one whose
    conversation the next turn continues (for the first turns of a fork, the origin's turn)."""
    found: str | None = await db.fetchval(
        "SELECT COALESCE(("
        "  SELECT r.id FROM workflow_runs r, workflow_runs me "
        "  WHERE me.id = $2 AND r.thread_id = $1 AND r.id <> me.id "
        "  AND (r.created_at, r.id) < (me.created_at, me.id) "
        "  AND EXISTS (SELECT 1 FROM step_runs s JOIN llm_calls c ON c.step_run_id = s.id "
        "              WHERE s.workflow_run_id = r.id AND s.step_name = $3 AND s.visit = 1 "
        "              AND c.status = 'completed') "
        "  ORDER BY r.created_at DESC, r.id DESC LIMIT 1"
        "), (SELECT forked_from_run_id FROM threads WHERE id = $1))",
        thread_id,
        run_id,
        step_name,
    )
    return found


async def fork_point(db: asyncpg.Pool | asyncpg.Connection, thread_id: str, step_name: str) -> str | None:
    """The turn a fork of the thread continues from: its latest turn that got a model answer."""
    found: str | None = await db.fetchval(
        "SELECT COALESCE(("
        "  SELECT r.id FROM workflow_runs r WHERE r.thread_id = $1 "
        "  AND EXISTS (SELECT 1 FROM step_runs s JOIN llm_calls c ON c.step_run_id = s.id "
        "              WHERE s.workflow_run_id = r.id AND s.step_name = $2 AND s.visit = 1 "
        "              AND c.status = 'completed') "
        "  ORDER BY r.created_at DESC, r.id DESC LIMIT 1"
        "), (SELECT forked_from_run_id FROM threads WHERE id = $1))",
        thread_id,
        step_name,
    )
    return found


# -- messages sent to a running llm step (`steer`) -------------------------------------------------


async def insert_run_message(conn: asyncpg.Connection, run_id: str, content: str) -> asyncpg.Record:
    return await conn.fetchrow(
        "INSERT INTO run_messages (id, workflow_run_id, content) VALUES ($1, $2, $3) "
        "RETURNING id, workflow_run_id, content, status, created_at",
        new_id("rmsg"),
        run_id,
        content,
    )


async def messages_to_inject(
    pool: asyncpg.Pool, run_id: str, step_name: str, visit: int, next_round: int
) -> list[asyncpg.Record]:
    """What the step's next model call carries: pending messages, and messages already injected
    into this very round by an execution that died before the round's model call committed."""
    rows: list[asyncpg.Record] = await pool.fetch(
        "SELECT id, content, status FROM run_messages WHERE workflow_run_id = $1 "
        "AND (status = 'pending' OR (status = 'injected' AND step_name = $2 AND visit = $3 AND round >= $4)) "
        "ORDER BY created_at, id",
        run_id,
        step_name,
        visit,
        next_round,
    )
    return rows


async def mark_injected(
    conn: asyncpg.Connection, ids: Sequence[str], step_name: str, visit: int, round_: int
) -> list[str]:
    rows = await conn.fetch(
        "UPDATE run_messages SET status = 'injected', step_name = $2, visit = $3, round = $4, "
        "injected_at = now() WHERE id = ANY($1::text[]) AND status = 'pending' RETURNING id",
        list(ids),
        step_name,
        visit,
        round_,
    )
    return [r["id"] for r in rows]
