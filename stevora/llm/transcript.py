"""Transcript repair, run before every provider call.

A conversation rebuilt from checkpoints (or handed over to a fallback model of another provider)
must still satisfy the strictest API: every assistant tool call answered exactly once, right
after it, with ids every provider accepts. `prepare_transcript` is pure and deterministic, so
running it on the same stored history always gives the same request.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections import deque

from stevora.llm.messages import Message, ToolCall

INTERRUPTED_RESULT = json.dumps({"error": "Tool call was interrupted before it produced a result"})

# OpenAI caps tool-call ids at 40 characters, Anthropic allows [a-zA-Z0-9_-]{1,64}: take both.
_PORTABLE_ID = re.compile(r"^[a-zA-Z0-9_-]{1,40}$")
# Mistral wants exactly nine alphanumerics.
_MISTRAL_ID = re.compile(r"^[a-zA-Z0-9]{9}$")


def prepare_transcript(messages: list[Message], *, provider_name: str) -> list[Message]:
    """Pair every tool call with exactly one result, normalise ids, drop empty assistant turns.

    * Results are moved directly after the assistant turn whose call they answer (in call
      order); a call without a result gets an error result (`is_error=True`); results for
      unknown ids and second results for one call are dropped.
    * Ids that are not portable (or repeat an earlier id) are replaced deterministically, and
      their results are rewritten the same way.
    * Assistant turns with neither text nor tool calls are dropped (Anthropic rejects them).

    The tool loop calls this through `TranscriptRepair`, which gives the same result for a
    transcript that only grows without repairing its unchanged prefix again.
    """
    out: list[Message] = []
    _repair(messages, 0, len(messages), out, set(), 0, _id_format(provider_name), None)
    return out


class TranscriptRepair:
    """`prepare_transcript` of a transcript that only grows at its end, kept up to date.

    The tool loop prepares the same conversation before every model call, one round longer each
    time. A segment (an assistant turn with tool calls and what follows it up to the next
    assistant turn) is final once a later assistant turn exists: it is repaired once into the
    kept prefix, with the ids it used. Only the open end (the last assistant turn and its results
    so far) is repaired on each call, so a call costs the same at round 1 and at round 100.
    The result equals `prepare_transcript(messages)` as long as `messages` is one list that is
    only appended to (the loop's `LoopState.transcript`); another list, or one shorter than the
    repaired prefix or whose last repaired message was replaced, is repaired from the start.
    """

    __slots__ = ("_anchor", "_done", "_id_format", "_list", "_open", "_out", "_round", "_used")

    def __init__(self, provider_name: str) -> None:
        self._id_format = _id_format(provider_name)
        self._reset()

    def _reset(self, messages: list[Message] | None = None) -> None:
        self._list = messages
        self._out: list[Message] = []  # messages[:_done], repaired
        self._used: set[str] = set()  # tool-call ids used by the repaired prefix
        self._round = 0  # assistant turns with tool calls in the prefix
        self._done = 0  # always 0 or the index of an assistant turn
        self._anchor: Message | None = None  # messages[_done - 1] when the prefix was repaired
        # The open end as the last call repaired it: (its end, its last message, the repaired
        # messages, the ids they used, the round count after it). When it has become final
        # unchanged (the usual round: the tool results came, then the next assistant turn), it
        # joins the prefix as it is instead of being repaired a second time.
        self._open: tuple[int, Message, list[Message], list[str], int] | None = None

    def prepare(self, messages: list[Message]) -> list[Message]:
        n = len(messages)
        if messages is not self._list or (
            self._done and (self._done > n or messages[self._done - 1] is not self._anchor)
        ):
            self._reset(messages)
        last = n - 1
        while last > self._done and messages[last].role != "assistant":
            last -= 1
        if last > self._done:  # every segment before the last assistant turn is final
            opened = self._open
            if opened is not None and opened[0] == last and opened[1] is messages[last - 1]:
                self._out += opened[2]  # the open end of the last call, now final, unchanged
                self._used.update(opened[3])
                self._round = opened[4]
            else:
                self._round = _repair(
                    messages, self._done, last, self._out, self._used, self._round, self._id_format, None
                )
            self._done = last
            self._anchor = messages[last - 1]
        tail: list[Message] = []
        added: list[str] = []
        rounds = _repair(messages, self._done, n, tail, self._used, self._round, self._id_format, added)
        for call_id in added:  # the open segment's ids are not final yet
            self._used.discard(call_id)
        self._open = (n, messages[n - 1], tail, added, rounds) if n > self._done else None
        return self._out + tail


def _id_format(provider_name: str) -> re.Pattern[str]:
    return _MISTRAL_ID if provider_name.lower().startswith("mistral") else _PORTABLE_ID


def _repair(
    messages: list[Message],
    start: int,
    end: int,
    out: list[Message],
    used_ids: set[str],
    round_no: int,
    id_format: re.Pattern[str],
    added: list[str] | None,
) -> int:
    """Repair `messages[start:end]` onto `out` (see `prepare_transcript`); `start` is 0 or an
    assistant turn, and `end` is the list's end or an assistant turn. Returns the round count;
    the ids the segments used are added to `used_ids` (and listed in `added` when given)."""
    i = start
    while i < end:
        message = messages[i]
        i += 1
        role = message.role
        if role == "tool":
            continue  # orphan: not inside an assistant turn's segment
        if role != "assistant":
            out.append(message)
            continue
        calls = message.tool_calls
        if not calls:
            if message.content:
                out.append(message)
            continue
        round_no += 1
        # The segment: everything up to the next assistant turn. Its tool messages answer
        # this turn's calls; its other messages keep their order after the results.
        segment_end = i
        while segment_end < end and messages[segment_end].role != "assistant":
            segment_end += 1
        segment_start, i = i, segment_end

        # The usual segment, checked without allocating: portable new ids, each answered once, in
        # order, by the messages right after it, and nothing else in the segment. Kept as it is.
        k = len(calls)
        if segment_end - segment_start == k:
            for index in range(k):
                call_id = calls[index].id
                item = messages[segment_start + index]
                if (
                    item.tool_call_id != call_id
                    or item.role != "tool"
                    or item.content is None
                    or call_id in used_ids
                    or not id_format.match(call_id)
                ):
                    break
                used_ids.add(call_id)
                if added is not None:
                    added.append(call_id)
            else:
                out.append(message)
                out += messages[segment_start:segment_end]
                continue
            for taken in range(index):  # undo the ids the fast path took, then repair in full
                used_ids.discard(calls[taken].id)
                if added is not None:
                    added.pop()

        new_calls = _renamed_calls(calls, round_no, used_ids, id_format, added)
        waiting: dict[str, deque[int]] = {}
        for index, call in enumerate(calls):
            waiting.setdefault(call.id, deque()).append(index)
        results: dict[int, Message] = {}
        for item in messages[segment_start:segment_end]:
            if item.role != "tool":
                continue
            queue = waiting.get(item.tool_call_id or "")
            if not queue:
                continue  # unknown id, or this call already has its result
            index = queue.popleft()
            # Reuse unchanged messages.
            new_id = new_calls[index].id
            if item.tool_call_id == new_id and item.content is not None:
                results[index] = item
            else:
                results[index] = dataclasses.replace(item, tool_call_id=new_id, content=item.content or "")

        unchanged = all(new is old for new, old in zip(new_calls, calls, strict=True))
        out.append(message if unchanged else dataclasses.replace(message, tool_calls=tuple(new_calls)))
        for index, call in enumerate(new_calls):
            out.append(
                results.get(index)
                or Message.tool_result(call.id, INTERRUPTED_RESULT, name=call.name, is_error=True)
            )
        out.extend(item for item in messages[segment_start:segment_end] if item.role != "tool")
    return round_no


def _renamed_calls(
    calls: tuple[ToolCall, ...],
    round_no: int,
    used_ids: set[str],
    id_format: re.Pattern[str],
    added: list[str] | None,
) -> list[ToolCall]:
    renamed: list[ToolCall] = []
    for index, call in enumerate(calls):
        new_id = call.id
        if not id_format.match(call.id) or call.id in used_ids:
            new_id = _fresh_id(call.id, round_no, index, used_ids, id_format)
        used_ids.add(new_id)
        if added is not None:
            added.append(new_id)
        renamed.append(call if new_id == call.id else dataclasses.replace(call, id=new_id))
    return renamed


def _fresh_id(
    original: str, round_no: int, index: int, used_ids: set[str], id_format: re.Pattern[str]
) -> str:
    attempt = 0
    while True:
        if id_format is _MISTRAL_ID:
            seed = f"{original}|{round_no}|{index}|{attempt}".encode()
            candidate = hashlib.sha256(seed).hexdigest()[:9]
        else:
            candidate = f"call_{round_no}_{index}" + (f"_{attempt}" if attempt else "")
        if candidate not in used_ids:
            return candidate
        attempt += 1
