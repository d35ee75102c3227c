"""The `llm` step's conversation state, rebuilt from committed rows on every (re)start.

Each round is stored once (`llm_calls` + `tool_trace`), so the history grows linearly and a
resumed step sees exactly what the model saw before the crash.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from stevora.db import checkpoints
from stevora.db.checkpoints import CommittedRound
from stevora.definitions import LlmStep
from stevora.engine.steps.llm_attachments import render_parts
from stevora.llm.messages import Message, ToolCall, Usage, reasoning_of
from stevora.templating import render_template


def render_prompt(
    step: LlmStep, input: dict[str, Any], state: dict[str, Any], *, max_attachment_bytes: int | None = None
) -> list[Message]:
    """The step's messages, rendered; a message of parts has its images and files checked
    (`InvalidAttachment` naming the field)."""
    messages: list[Message] = []
    if step.system_prompt:
        messages.append(Message.system(render_template(step.system_prompt, input=input, state=state)))
    for index, m in enumerate(step.messages):
        if isinstance(m.content, str):
            messages.append(
                Message(role=m.role, content=render_template(m.content, input=input, state=state))
            )
        else:
            limit = max_attachment_bytes if max_attachment_bytes is not None else 1 << 62
            messages.append(render_parts(step, index, m.content, input=input, state=state, max_bytes=limit))
    return messages


@dataclass(slots=True)
class LoopState:
    transcript: list[Message]
    rounds: list[CommittedRound]
    next_round: int
    tool_rounds: int  # rounds whose tool calls were (or are to be) executed
    feedback_attempts: int = 0
    pending_append: list[Message] = field(default_factory=list)  # stored with the next model call
    steered: int = 0  # how many of pending_append's last messages were sent in from outside (not feedback)
    cost_usd: float = 0.0
    usage: Usage = field(default_factory=Usage)
    # Rounds (counted by assistant turns) whose tool results the requests send as stubs (the
    # step's `context` strategy; stored with each call's request, so a rebuild trims the same).
    trimmed_through: int = 0
    # The step's latest `compact` checkpoint: its summary stands for the rounds it covers in every
    # later request (read from its row on a rebuild, never generated again).
    compaction: Compaction | None = None
    # A thread turn's first call: (the earlier turn's run id, where its history starts in
    # `pending_append`, how many messages it is). The call stores the reference, not the history.
    history_ref: tuple[str, int, int] | None = None


@dataclass(frozen=True, slots=True)
class Compaction:
    """A committed compaction: the summary of the rounds (by count of assistant turns) through
    `through`, committed as the model call numbered `round`."""

    round: int
    through: int
    summary: str
    tokens_after: int

    @classmethod
    def of(cls, r: CommittedRound) -> Compaction | None:
        """The compaction a committed model call is, or None for a round of the loop."""
        marker = r.request.get("compaction")
        if not isinstance(marker, dict):
            return None
        return cls(r.round, marker["through"], r.response.get("text") or "", marker.get("tokensAfter") or 0)


def response_message(response: dict[str, Any]) -> Message:
    """The assistant turn a stored response stands for."""
    calls = tuple([ToolCall(c["id"], c["name"], c["arguments"]) for c in response.get("toolCalls") or ()])
    reasoning = reasoning_of(response.get("reasoning"))
    return Message(role="assistant", content=response.get("text"), tool_calls=calls, reasoning=reasoning)


def rebuild(
    rounds: list[CommittedRound], prompt: list[Message], histories: Mapping[str, list[Message]] | None = None
) -> LoopState:
    """The conversation so far, from the committed rows (each stored once). A round whose request
    names the history it continued (`historyFrom`, a thread turn's first call) gets that history
    from `histories` (by run id, `stevora.engine.steps.llm_thread.conversations`) at `historyAt`;
    without `histories`, the turn's own messages only."""
    if not rounds:
        return LoopState(transcript=[], rounds=[], next_round=1, tool_rounds=0, pending_append=list(prompt))
    transcript: list[Message] = []
    state = LoopState(transcript=transcript, rounds=[], next_round=rounds[-1].round + 1, tool_rounds=0)
    for r in rounds:
        compaction = Compaction.of(r)
        if compaction is not None:  # a `compact` checkpoint: not a turn of the conversation
            state.compaction = compaction
            state.cost_usd += r.cost_usd
            state.usage = state.usage + Usage(input_tokens=r.input_tokens, output_tokens=r.output_tokens)
            continue
        state.rounds.append(r)
        sent = [Message.from_dict(m) for m in r.request.get("messages") or ()]
        ref = r.request.get("historyFrom")
        if ref is not None and histories is not None:
            at = r.request.get("historyAt") or 0
            sent[at:at] = histories.get(ref, ())
        transcript.extend(sent)
        if r.request.get("feedback"):
            state.feedback_attempts += 1
        state.trimmed_through = max(state.trimmed_through, r.request.get("contextTrimmedThrough") or 0)
        msg = response_message(r.response)
        transcript.append(msg)
        if msg.tool_calls:
            state.tool_rounds += 1
        for index, call in enumerate(msg.tool_calls):
            trace = r.tool_results.get(index)
            if trace is not None:
                transcript.append(
                    Message.tool_result(
                        call.id,
                        checkpoints.replay_result_text(trace),
                        name=call.name,
                        is_error=trace["status"] != "completed",
                    )
                )
        state.cost_usd += r.cost_usd
        state.usage = state.usage + Usage(input_tokens=r.input_tokens, output_tokens=r.output_tokens)
    return state
