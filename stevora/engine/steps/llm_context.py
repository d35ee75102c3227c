"""Keeping an `llm` step's input inside the model's window: the step's `context` strategy.

`trim_tool_results`: before a round whose input would exceed `maxInputTokens`, the results of
every round but the last `keepLastRounds` are replaced by a stub naming the call. Rounds are
counted by assistant turns (the n-th assistant turn of the step's transcript is its n-th round).

Deterministic on rebuild, so a resumed step sends what the lost one sent: the decision is a pure
function of the committed rows (the previous round's reported input tokens and the transcript),
and the rounds trimmed so far are stored with each call's request (`contextTrimmedThrough`), so
a rebuilt transcript trims exactly the rounds the original requests trimmed.
"""

from __future__ import annotations

import dataclasses
import json

from stevora.definitions import LlmStep
from stevora.engine.steps.llm_state import LoopState
from stevora.llm.messages import Message

# Tokens are estimated as characters / 4 of the messages' JSON (no tokenizer in the engine); the
# provider's own count of the previous round anchors the estimate, so the error stays one round's.
CHARS_PER_TOKEN = 4


def estimated_input_tokens(st: LoopState, messages: list[Message], through: int = 0) -> int:
    """The next request's input tokens: the previous round's reported input, plus an estimate of
    what was added after its request (its answer, the tool results, appended messages), as sent
    with the tool results of the first `through` rounds trimmed."""
    if not st.rounds:
        return _estimate(messages)  # no assistant turn yet: nothing to trim
    last_assistant = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=0)
    tail = messages[last_assistant:]
    # Only the tail is estimated, so only the tail is trimmed (its one assistant turn is round
    # `rounds`): not a rewrite of the whole transcript per round.
    rounds = sum(1 for m in messages if m.role == "assistant")
    if through >= rounds:
        tail = trimmed(tail, 1)
    return st.rounds[-1].input_tokens + _estimate(tail)


def trim_point(step: LlmStep, st: LoopState, messages: list[Message]) -> int:
    """The rounds (by count of assistant turns) whose tool results this request sends as stubs."""
    context = step.context
    if context is None:
        return st.trimmed_through
    if estimated_input_tokens(st, messages, st.trimmed_through) <= context.max_input_tokens:
        return st.trimmed_through
    rounds = sum(1 for m in messages if m.role == "assistant")
    return max(st.trimmed_through, rounds - context.keep_last_rounds)


def trimmed(messages: list[Message], through: int) -> list[Message]:
    """`messages` with the tool results of the first `through` rounds replaced by stubs."""
    if through <= 0:
        return messages
    out: list[Message] = []
    seen = 0  # assistant turns so far
    names: dict[str, str] = {}
    for message in messages:
        if message.role == "assistant":
            seen += 1
            names = {call.id: call.name for call in message.tool_calls}
        elif message.role == "tool" and seen <= through:
            # As short as it can say it: every trimmed round keeps paying for its stub. The call
            # it answers is named by the message's own tool_call_id.
            name = message.name or names.get(message.tool_call_id or "", "tool")
            stub = json.dumps({"trimmed": True, "tool": name}, ensure_ascii=False, separators=(",", ":"))
            message = dataclasses.replace(message, content=stub)
        out.append(message)
    return out


_NOTE = (
    "result removed to keep the conversation inside the context window; call the tool again if it is needed"
)


def _estimate(messages: list[Message]) -> int:
    return len(json.dumps([m.to_dict() for m in messages], ensure_ascii=False)) // CHARS_PER_TOKEN
