"""Threads: conversations whose turns are runs, and messages sent while a turn works (docs/threads.md).

A message starts a turn: a run of the thread's definition with input `{"content": ...}` and the
thread's state. A turn starts only when every older turn of its thread has ended (the claim's
fence, `stevora.db.concurrency.turn_ready`), and the ending of a turn dispatches the next: turns
run one at a time and in order, without a concurrency slot's locks and queue. While a turn is
active, the message's `onActive` policy decides, in the transaction that locks the thread row:

* `reject`    → THREAD_BUSY (409) naming the active run; nothing is written;
* `enqueue`   → the turn's run is created now and waits (PENDING) for its turn (202): durable, in order;
* `interrupt` → the active run is cancelled with reason `interrupted` and the new turn created (201);
* `steer`     → the message is stored for the active run (202); its llm step takes it at its next
  round boundary (`stevora.engine.steps.llm_thread`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import asyncpg

from stevora.db import checkpoints, runs
from stevora.db import threads as db_threads
from stevora.db.reads import threads as thread_reads
from stevora.db.reads.rows import DbRow
from stevora.db.reads.threads import ThreadRow
from stevora.definitions.flow import Concurrency
from stevora.engine import commands, endings
from stevora.engine.hints import dispatch_hint
from stevora.engine.steps.llm_state import rebuild
from stevora.engine.steps.llm_thread import conversation_of
from stevora.errors import ConflictError, InvalidStateTransition, NotFoundError
from stevora.statuses import RunStatus

if TYPE_CHECKING:
    from stevora.runtime import Runtime

POLICIES = ("reject", "enqueue", "interrupt", "steer")
INTERRUPTED = "interrupted"


class ThreadBusy(ConflictError):
    code = "THREAD_BUSY"


@dataclass(frozen=True, slots=True)
class Sent:
    """What became of a message: the run it started or went to, and whether that run started now."""

    run_id: str
    policy: str  # the policy applied ("start" when no turn was active)
    queued: bool  # enqueue / steer: 202
    message_id: str | None = None  # steer: the stored message
    interrupted_run_id: str | None = None


async def create_thread(
    rt: Runtime,
    workspace_id: str,
    definition_id: str,
    *,
    metadata: dict[str, str],
    state: dict[str, Any],
    on_active: str,
    forked_from_run_id: str | None = None,
) -> ThreadRow:
    row = await db_threads.insert_thread(
        rt.pool,
        workspace_id=workspace_id,
        definition_id=definition_id,
        metadata=metadata,
        state=state,
        on_active=on_active,
        forked_from_run_id=forked_from_run_id,
    )
    if row is None:
        raise NotFoundError("Workflow definition not found", details={"definitionId": definition_id})
    return ThreadRow.of(row)


async def fork_thread(rt: Runtime, workspace_id: str, origin_id: str) -> ThreadRow:
    """A new thread with the origin's definition, metadata, state and policy, whose first turn
    continues the origin's conversation as it is now (its latest answered turn)."""
    origin = await thread_reads.get(rt.pool, workspace_id, origin_id)
    if origin is None:
        raise NotFoundError("Thread not found", details={"forkOf": origin_id})
    step = await conversation_step(rt, origin)
    point = await db_threads.fork_point(rt.pool, origin.id, step) if step else None
    return await create_thread(
        rt,
        workspace_id,
        origin.definition_id,
        metadata=origin.metadata,
        state=origin.state,
        on_active=origin.on_active,
        forked_from_run_id=point,
    )


async def conversation_step(rt: Runtime, thread: ThreadRow) -> str | None:
    """The step that carries the thread's conversation: its definition's first `llm` step."""
    spec = await rt.definitions.get_in_workspace(thread.workspace_id, thread.definition_id)
    return next((s.name for s in spec.steps if s.type == "llm"), None) if spec is not None else None


async def send(
    rt: Runtime, workspace_id: str, thread_id: str, content: str, on_active: str | None = None
) -> Sent:
    """A message to the thread: a new turn, or the active turn's policy applied (see the module)."""
    dispatch: list[str] = []
    async with rt.pool.acquire() as conn, conn.transaction():
        thread = await db_threads.lock_thread(conn, workspace_id, thread_id)
        if thread is None:
            raise NotFoundError("Thread not found", details={"threadId": thread_id})
        policy = on_active or thread["on_active"]
        open_turns = await db_threads.open_turns(conn, thread_id)
        active = open_turns[0]["id"] if open_turns else None
        if active is None:
            run_id = await _new_turn(rt, conn, thread, content)
            sent = Sent(run_id, "start", queued=False)
        elif policy == "reject":
            raise ThreadBusy(
                f"Thread {thread_id} is busy with run {active}; send with onActive enqueue, "
                "interrupt or steer, or wait for the run to end",
                details={"threadId": thread_id, "activeRunId": active},
            )
        elif policy == "enqueue":
            sent = Sent(await _new_turn(rt, conn, thread, content), policy, queued=True)
        elif policy == "interrupt":
            # Queued turns are left in place: the new one starts after them.
            ended = await endings.cancel_run(conn, active, reason=INTERRUPTED)
            dispatch += ended.dispatch
            run_id = await _new_turn(rt, conn, thread, content)
            sent = Sent(run_id, policy, queued=len(open_turns) > 1, interrupted_run_id=active)
        else:  # steer
            message = await db_threads.insert_run_message(conn, active, content)
            sent = Sent(active, policy, queued=True, message_id=message["id"])
    if sent.policy != "steer":
        dispatch.append(sent.run_id)
    for run_id in dispatch:
        await dispatch_hint(rt.dispatcher, run_id)
    return sent


async def _new_turn(rt: Runtime, conn: asyncpg.Connection, thread: DbRow, content: str) -> str:
    row, _ = await commands.create_run(
        rt,
        thread["workspace_id"],
        thread["definition_id"],
        {"content": content},
        concurrency=Concurrency(key=db_threads.concurrency_key(thread["id"]), limit=1),
        conn=conn,
    )
    await db_threads.make_turn(conn, row["id"], thread["id"], thread["state"])
    return str(row["id"])


async def steer_run(rt: Runtime, workspace_id: str, run_id: str, content: str) -> DbRow:
    """A message for a run's llm step, taken at its next round boundary (any active run)."""
    async with rt.pool.acquire() as conn, conn.transaction():
        run = await runs.get_run_in_workspace(conn, workspace_id, run_id)
        if run is None:
            raise NotFoundError("Workflow run not found", details={"workflowRunId": run_id})
        if run["status"] not in (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING, RunStatus.PAUSED):
            raise InvalidStateTransition(
                f"Workflow run {run_id} is {run['status']}: a message goes to an active run only",
                details={"workflowRunId": run_id, "status": run["status"]},
            )
        row: DbRow = await db_threads.insert_run_message(conn, run_id, content)
    return row


async def delete_thread(rt: Runtime, workspace_id: str, thread_id: str) -> ThreadRow:
    """Deletes the thread; its turns that have not ended are cancelled (their runs stay)."""
    dispatch: list[str] = []
    async with rt.pool.acquire() as conn, conn.transaction():
        thread = await db_threads.lock_thread(conn, workspace_id, thread_id)
        if thread is None:
            raise NotFoundError("Thread not found", details={"threadId": thread_id})
        for turn in reversed(await db_threads.open_turns(conn, thread_id)):
            dispatch += (await endings.cancel_run(conn, turn["id"])).dispatch
        deleted = await db_threads.delete_thread(conn, workspace_id, thread_id)
    for run_id in dispatch:
        await dispatch_hint(rt.dispatcher, run_id)
    return ThreadRow.of(deleted)


@dataclass(frozen=True, slots=True)
class Entry:
    """One message of the conversation: what it says and the turn (run) it belongs to."""

    role: str
    content: str | None
    run_id: str
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    injected_round: int | None = None  # a steered message: the round it went into
    status: str | None = None  # a steered message: pending / injected / discarded


async def conversation(rt: Runtime, thread: ThreadRow) -> list[Entry]:
    """The thread's messages in order, each with its run: every turn's own part of the
    conversation its step sent (after the history it continued), then the turn's answer; a
    turn that got no model answer shows its user message; steered messages that did not go in
    (pending, or discarded because the turn ended first) follow their turn."""
    step_name = await conversation_step(rt, thread)
    turns = await thread_reads.turns(rt.pool, thread.id)
    sent = await thread_reads.run_messages(rt.pool, [t.id for t in turns])
    by_run: dict[str, list[Any]] = {}
    for m in sent:
        by_run.setdefault(m.workflow_run_id, []).append(m)
    entries: list[Entry] = []
    known = 0  # length of the conversation the next turn continues (system prompt left out)
    if thread.forked_from_run_id and step_name:  # a fork: the origin's conversation comes first
        inherited = await conversation_of(rt.pool, thread.forked_from_run_id, step_name)
        entries += [_entry(m, thread.forked_from_run_id, status="forked") for m in inherited]
        known = len(inherited)
    for turn in turns:
        rounds = await checkpoints.load_rounds(rt.pool, turn.id, step_name, 1) if step_name else []
        injected = {m.content: m for m in by_run.get(turn.id, []) if m.status == "injected"}
        if rounds:
            # The turn's rows: its own part only when its first call stored the history it
            # continued as a reference (`historyFrom`), else that history first.
            transcript = [m for m in rebuild(rounds, []).transcript if m.role != "system"]
            if rounds[0].request.get("historyFrom") is not None:
                own, known = transcript, known + len(transcript)
            else:
                own, known = transcript[known:], len(transcript)
            for message in own:
                steered = injected.pop(message.content, None) if message.role == "user" else None
                if steered is None:
                    entries.append(_entry(message, turn.id))
                else:
                    entries.append(_entry(message, turn.id, round_=steered.round, status="injected"))
        else:
            entries.append(Entry("user", str((turn.input or {}).get("content", "")), turn.id))
        for m in by_run.get(turn.id, []):
            if m.status != "injected":
                entries.append(Entry("user", m.content, turn.id, status=m.status))
    return entries


def _entry(message: Any, run_id: str, *, round_: int | None = None, status: str | None = None) -> Entry:
    calls = [c.to_dict() for c in message.tool_calls] or None
    return Entry(
        message.role, message.content, run_id, calls, message.tool_call_id, message.name, round_, status
    )
