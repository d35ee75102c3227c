"""What reaches an `llm` step from outside its run: a thread's history and steered messages.

* History (docs/threads.md): a thread turn's conversation step (the definition's first `llm`
  step, first visit) starts from the conversation of the previous turn that got a model answer,
  rebuilt from that turn's committed rows exactly as a resumed step rebuilds its own (so the
  prefix a turn sends is byte for byte what the previous turn sent), then its own messages. Its
  first call stores the history as a reference (`historyFrom`: that turn's run id, `historyAt`:
  where it goes), not again: each turn stores what it added, and a rebuild reads the chain of
  turns the reference leads through in two statements.
* Steering: a message sent to a running run (`onActive: steer`, or `POST
  /v1/workflow-runs/{id}/messages`) is taken at the step's next round boundary, after that
  round's tool results. The step looks for messages only when the round's last checkpoint (or
  the transition that started the execution) returned `pending_messages` true, so a run nobody
  steers pays no query per round. Taking it commits `MESSAGE_INJECTED` with the round it goes into, fenced
  by the lease; the message itself is stored with that round's model call (its request's
  `messages`). An execution that dies between the two finds the message marked for the round it
  has not committed yet and sends it again, without a second event: once in the transcript.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import asyncpg

from stevora.db import checkpoints, runs
from stevora.db import threads as db_threads
from stevora.db.checkpoints import CommittedRound
from stevora.engine.steps.base import StepExecution
from stevora.engine.steps.llm_state import LoopState, rebuild
from stevora.events import Event, EventType
from stevora.llm.messages import Message
from stevora.statuses import RunStatus

if TYPE_CHECKING:
    from stevora.runtime import Runtime


@dataclass(frozen=True, slots=True)
class History:
    """The conversation a turn continues: the earlier turn's run and its messages."""

    run_id: str | None
    messages: list[Message]


async def thread_history(rt: Runtime, ex: StepExecution) -> History:
    """The earlier turns' conversation this turn's step continues (empty for the first turn):
    three statements (the previous turn, the chain's rows, their tool results), however long."""
    if ex.thread_id is None:
        return History(None, [])
    previous = await db_threads.previous_turn(rt.pool, ex.thread_id, ex.run_id, ex.step_name)
    if previous is None:
        return History(None, [])
    return History(previous, await conversation_of(rt.pool, previous, ex.step_name))


async def conversation_of(pool: asyncpg.Pool, run_id: str, step_name: str) -> list[Message]:
    """A turn's whole conversation (system prompt left out), the history it continued included."""
    return conversations(await checkpoints.load_chain(pool, run_id, step_name)).get(run_id, [])


def conversations(chain: dict[str, list[CommittedRound]]) -> dict[str, list[Message]]:
    """Each turn's conversation, system prompt left out (the next turn's is its own, rendered with
    its input and state), from the rows of a chain of turns (`checkpoints.load_chain`): oldest
    first, each continuing the one its first call names. Rebuilt exactly as a resumed step
    rebuilds its own, so a turn's prefix is byte for byte what the previous turn sent."""
    out: dict[str, list[Message]] = {}
    for run_id, rounds in sorted(chain.items(), key=lambda kv: (kv[1][0].committed_at, kv[0])):
        out[run_id] = [m for m in rebuild(rounds, [], out).transcript if m.role != "system"]
    return out


async def histories_for(
    pool: asyncpg.Pool, rounds: list[CommittedRound], step_name: str
) -> dict[str, list[Message]]:
    """The histories a resumed turn's committed rounds name (none for a run that is no turn)."""
    out: dict[str, list[Message]] = {}
    for r in rounds:
        ref = r.request.get("historyFrom")
        if ref is not None and ref not in out:
            out.update(conversations(await checkpoints.load_chain(pool, ref, step_name)))
    return out


def with_history(st: LoopState, history: History) -> None:
    """The turn's first request: system prompt, then the history, then the turn's own messages;
    the call stores a reference to the earlier turn in place of the history (`history_ref`)."""
    if not history.messages or history.run_id is None:
        return
    prompt = st.pending_append
    system = [m for m in prompt if m.role == "system"]
    st.pending_append = [*system, *history.messages, *(m for m in prompt if m.role != "system")]
    st.history_ref = (history.run_id, len(system), len(history.messages))


async def take_messages(rt: Runtime, ex: StepExecution, st: LoopState) -> None:
    """Append the messages sent to the run since the last round to the next model call.

    Only when the last statement that returned the run (the checkpoint that ended the round, or
    the transition that started this execution) saw one pending, or when this execution resumes
    one that may have taken messages for a round it did not commit (`ex.inbox`): no round trip
    for a run nobody sends anything to."""
    if not ex.inbox.pending:
        return
    ex.inbox.pending = False  # a message committed after the query below: the next checkpoint says so
    rows = await db_threads.messages_to_inject(rt.pool, ex.run_id, ex.step_name, ex.visit, st.next_round)
    if not rows:
        return
    pending = [r["id"] for r in rows if r["status"] == "pending"]
    if pending:
        async with rt.pool.acquire() as conn, conn.transaction():
            marked = await db_threads.mark_injected(conn, pending, ex.step_name, ex.visit, st.next_round)
            by_id = {r["id"]: r for r in rows}
            await runs.update_run(
                conn,
                ex.run_id,
                expect=[RunStatus.RUNNING],
                owner=ex.owner,
                events=[
                    Event(
                        EventType.MESSAGE_INJECTED,
                        {
                            "messageId": m,
                            "stepName": ex.step_name,
                            "round": st.next_round,
                            "content": by_id[m]["content"],
                        },
                        ex.step_run_id,
                    )
                    for m in marked
                ],
            )
    st.pending_append.extend(Message.user(r["content"]) for r in rows)
    st.steered += len(rows)
