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
from stevora.engine.steps.llm_state import Compaction, LoopState
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
    if context is None or context.strategy != "trim_tool_results":
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


def _estimate(messages: list[Message]) -> int:
    return len(json.dumps([m.to_dict() for m in messages], ensure_ascii=False)) // CHARS_PER_TOKEN


# -- `compact` ------------------------------------------------------------------------------

COMPACT_INSTRUCTION = (
    "The text above is the earlier part of a conversation between a user, an assistant and the "
    "assistant's tools. Write a summary of it that lets the assistant carry on the task without it: "
    "the task and its constraints, what was found (facts, names, numbers, file paths, results of "
    "tool calls that are still needed), what was decided and done, and what is left to do. "
    "Reply with the summary only."
)
SUMMARY_HEADING = "Summary of the earlier part of this conversation (it was compacted to stay inside the context window):\n\n"


def compaction_point(step: LlmStep, st: LoopState, messages: list[Message]) -> tuple[int, int] | None:
    """`(through, tokensBefore)` when this round's request is to be compacted first: the rounds
    (by count of assistant turns) the new summary covers and the input the request would have
    without it. None: no compaction (not the strategy, under the limit, or nothing new to fold in).

    A pure function of the committed rows, so a rebuilt step decides as the lost one did; a
    compaction committed after the last round is never followed by another one before a round."""
    context = step.context
    if context is None or context.strategy != "compact" or not st.rounds:
        return None
    done = st.compaction
    if done is not None and done.round > st.rounds[-1].round:
        return None  # committed already for this round (a resumed step reads it, never redoes it)
    rounds = sum(1 for m in messages if m.role == "assistant")
    through = rounds - context.keep_last_rounds
    # At least `keepLastRounds` new rounds (and one) per summary: when the prompt and the kept
    # rounds alone are over the limit, the step does not compact again at every round.
    if through - (done.through if done is not None else 0) < max(1, context.keep_last_rounds):
        return None
    before = estimated_input_tokens(st, messages)
    if before <= context.max_input_tokens:
        return None
    return through, before


def compacted(messages: list[Message], compaction: Compaction | None) -> list[Message]:
    """`messages` (as a provider gets them) with the rounds the compaction covers replaced by its
    summary: the messages before the first assistant turn (the step's prompt) are kept as they
    are, then the summary as a user turn, then everything from the first assistant turn after
    the covered rounds. The cut is always before an assistant turn, so every kept tool call keeps
    its result and no result is kept without its call (both providers' pairing rules)."""
    if compaction is None:
        return messages
    head_end = len(messages)
    cut = len(messages)
    seen = 0
    for i, m in enumerate(messages):
        if m.role == "assistant":
            if seen == 0:
                head_end = i
            seen += 1
            if seen == compaction.through + 1:
                cut = i
                break
    return [*messages[:head_end], Message.user(SUMMARY_HEADING + compaction.summary), *messages[cut:]]


def compaction_prompt(messages: list[Message], previous: Compaction | None, through: int) -> Message:
    """The compaction call's one user turn: the previous summary and the rounds after it up to
    round `through` (the step's prompt aside: it is sent as it is with every request), as text,
    followed by the instruction. As text, not as turns: the call offers no tools, and a provider
    refuses tool calls and results in a request without tools."""
    covered = previous.through if previous is not None else 0
    lines = [f"[summary of the rounds before]\n{previous.summary}"] if previous is not None else []
    seen = 0
    for m in messages:
        if m.role == "assistant":
            seen += 1
            if seen == through + 1:
                break
        if seen > covered:
            lines.append(_as_text(m))
    transcript = "\n\n".join(lines)
    return Message.user(f"<conversation>\n{transcript}\n</conversation>\n\n{COMPACT_INSTRUCTION}")


def _as_text(m: Message) -> str:
    if m.role == "tool":
        kind = "tool error" if m.is_error else "tool result"
        return f"[{kind} {m.name or ''} {m.tool_call_id or ''}]\n{m.content or ''}"
    parts = [m.content] if m.content else []
    parts += [f"(calls {c.name} {c.arguments})" for c in m.tool_calls]
    return f"[{m.role}]\n" + "\n".join(parts)


def estimate(messages: list[Message]) -> int:
    return _estimate(messages)
