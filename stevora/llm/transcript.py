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
    """
    id_format = _MISTRAL_ID if provider_name.lower().startswith("mistral") else _PORTABLE_ID
    used_ids: set[str] = set()
    out: list[Message] = []
    i = 0
    round_no = 0
    while i < len(messages):
        message = messages[i]
        i += 1
        if message.role == "tool":
            continue  # orphan: not inside an assistant turn's segment
        if message.role != "assistant":
            out.append(message)
            continue
        if not message.tool_calls:
            if message.content:
                out.append(message)
            continue
        round_no += 1
        # The segment: everything up to the next assistant turn. Its tool messages answer
        # this turn's calls; its other messages keep their order after the results.
        segment_end = i
        while segment_end < len(messages) and messages[segment_end].role != "assistant":
            segment_end += 1
        segment = messages[i:segment_end]
        i = segment_end

        new_calls = _renamed_calls(message.tool_calls, round_no, used_ids, id_format)
        waiting: dict[str, deque[int]] = {}
        for index, call in enumerate(message.tool_calls):
            waiting.setdefault(call.id, deque()).append(index)
        results: dict[int, Message] = {}
        for item in segment:
            if item.role != "tool":
                continue
            queue = waiting.get(item.tool_call_id or "")
            if not queue:
                continue  # unknown id, or this call already has its result
            index = queue.popleft()
            # Reuse unchanged messages: this runs before every model call, on the whole history.
            new_id = new_calls[index].id
            if item.tool_call_id == new_id and item.content is not None:
                results[index] = item
            else:
                results[index] = dataclasses.replace(item, tool_call_id=new_id, content=item.content or "")

        unchanged = all(new is old for new, old in zip(new_calls, message.tool_calls, strict=True))
        out.append(message if unchanged else dataclasses.replace(message, tool_calls=tuple(new_calls)))
        for index, call in enumerate(new_calls):
            out.append(
                results.get(index)
                or Message.tool_result(call.id, INTERRUPTED_RESULT, name=call.name, is_error=True)
            )
        out.extend(item for item in segment if item.role != "tool")
    return out


def _renamed_calls(
    calls: tuple[ToolCall, ...], round_no: int, used_ids: set[str], id_format: re.Pattern[str]
) -> list[ToolCall]:
    renamed: list[ToolCall] = []
    for index, call in enumerate(calls):
        new_id = call.id
        if not id_format.match(call.id) or call.id in used_ids:
            new_id = _fresh_id(call.id, round_no, index, used_ids, id_format)
        used_ids.add(new_id)
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
