"""The fake LLM server's OpenAI Responses API (`POST /v1/responses`): answers and their SSE stream.

Bodies pass the SDK's strict response validation (`openai.types.responses.Response`); a streamed
answer is the event sequence the SDK reads (`response.created`, `response.output_item.added`,
`response.output_text.delta`, `response.function_call_arguments.delta`,
`response.output_item.done`, `response.completed`), each with its `sequence_number`.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from stevora.testing.fake_reasoning import reasoning_item
from stevora.testing.fake_stream import FakeResponse

_ids = itertools.count(1)


def responses_text(
    text: str,
    *,
    reasoning: str | None = None,
    model: str = "o4-mini",
    usage: Mapping[str, Any] | None = None,
) -> FakeResponse:
    """A final answer, after a reasoning item when `reasoning` is given."""
    output = [reasoning_item(reasoning)] if reasoning is not None else []
    output.append(
        {
            "id": f"msg_fake{next(_ids)}",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
    )
    return _response(output, model, usage)


def responses_tool_calls(
    calls: Sequence[tuple[str, str, str]],
    *,
    reasoning: str | None = None,
    model: str = "o4-mini",
    usage: Mapping[str, Any] | None = None,
) -> FakeResponse:
    """`calls` are `(call_id, name, arguments_json_string)`, after a reasoning item when given."""
    output = [reasoning_item(reasoning)] if reasoning is not None else []
    output += [
        {
            "id": f"fc_fake{next(_ids)}",
            "type": "function_call",
            "call_id": call_id,
            "name": name,
            "arguments": arguments,
            "status": "completed",
        }
        for call_id, name, arguments in calls
    ]
    return _response(output, model, usage)


def _response(output: list[dict[str, Any]], model: str, usage: Mapping[str, Any] | None) -> FakeResponse:
    reasoning_tokens = 7 * sum(1 for item in output if item["type"] == "reasoning")
    merged: dict[str, Any] = {
        "input_tokens": 20,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": 5 + reasoning_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
    }
    for key, value in (usage or {}).items():
        merged[key] = {**merged[key], **value} if isinstance(value, Mapping) and key in merged else value
    merged["total_tokens"] = merged["input_tokens"] + merged["output_tokens"]
    body = {
        "id": f"resp_fake{next(_ids)}",
        "object": "response",
        "created_at": time.time(),
        "status": "completed",
        "error": None,
        "incomplete_details": None,
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "store": False,
        "usage": merged,
    }
    return FakeResponse(body=body, kind="responses")


def reasoning_agent_responder(
    tool: str, rounds: int, *, model: str = "o4-mini", argument: str = "round"
) -> Callable[[dict[str, Any]], FakeResponse]:
    """A `Responder` for `/v1/responses`: a reasoning model that calls `tool` once per round for
    `rounds` rounds (a reasoning item before each call, `{argument: n}` as its arguments), then
    answers. Which round it is comes from the request (its `function_call_output` items), so a
    resent request gets the same answer."""

    def respond(body: dict[str, Any]) -> FakeResponse:
        done = sum(1 for item in body.get("input") or () if item.get("type") == "function_call_output")
        if done >= rounds:
            return responses_text(f"done after {done} rounds", reasoning="wrapping up", model=model)
        value: Any = done + 1 if argument == "round" else f"round {done + 1}"
        call = (f"call_r{done + 1}", tool, json.dumps({argument: value}))
        return responses_tool_calls([call], reasoning=f"round {done + 1}: call {tool}", model=model)

    return respond
