"""What reaches an `llm` step from outside its run: a thread's history and steered messages.

* History (docs/threads.md): a thread turn's conversation step (the definition's first `llm`
  step, first visit) starts from the conversation of the previous turn that got a model answer,
  rebuilt from that turn's committed rows exactly as a resumed step rebuilds its own (so the
  prefix a turn sends is byte for byte what the previous turn sent), then its own messages.
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

from typing import TYPE_CHECKING

from stevora.db import checkpoints, runs
from stevora.db import threads as db_threads
from stevora.engine.steps.base import StepExecution
from stevora.engine.steps.llm_state import LoopState, rebuild
from stevora.events import Event, EventType
from stevora.llm.messages import Message
from stevora.statuses import RunStatus

if TYPE_CHECKING:
    from stevora.runtime import Runtime


async def thread_history(rt: Runtime, ex: StepExecution) -> list[Message]:
    """The earlier turns' conversation this turn's step continues (empty for the first turn)."""
    if ex.thread_id is None:
        return []
    previous = await db_threads.previous_turn(rt.pool, ex.thread_id, ex.run_id, ex.step_name)
    if previous is None:
        return []
    rounds = await checkpoints.load_rounds(rt.pool, previous, ex.step_name, 1)
    # The system prompt is the current turn's own (rendered with this turn's input and state).
    return [m for m in rebuild(rounds, []).transcript if m.role != "system"]


def with_history(prompt: list[Message], history: list[Message]) -> list[Message]:
    """system prompt, then the history, then the turn's own messages."""
    if not history:
        return prompt
    system = [m for m in prompt if m.role == "system"]
    return [*system, *history, *(m for m in prompt if m.role != "system")]


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
