"""Reasoning for the fake LLM server: signed Anthropic thinking blocks and encrypted OpenAI
reasoning items, and the checks the real APIs make when they come back.

The fake signs what it hands out (HMAC-SHA256 under a key of the server process), so a later
request that drops a thinking block or reasoning item, or changes one byte of its text, signature
or encrypted content, gets the provider's 400 as the real API would answer it:

* Anthropic, thinking enabled: the assistant turn whose `tool_use` blocks the last `tool_result`s
  answer must start with a `thinking` or `redacted_thinking` block, and every thinking block's
  signature (every redacted block's data) must be one the fake issued for that text.
* OpenAI Responses, a reasoning model (`o*`, `gpt-5*`): each run of `function_call` items must be
  preceded by the `reasoning` item that was answered with them, its `encrypted_content` intact,
  and a reasoning item must be followed by the item that followed it in the answer (with its id).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import json
import secrets
from typing import Any

_KEY = secrets.token_bytes(32)
_ids = itertools.count(1)


def sign(text: str) -> str:
    """The fake's signature of `text` (base64, like the real one: opaque to the client)."""
    return base64.b64encode(hmac.new(_KEY, text.encode(), hashlib.sha256).digest()).decode()


def signed(text: str, signature: str) -> bool:
    return hmac.compare_digest(sign(text), signature)


# --- Anthropic -------------------------------------------------------------------------------


def thinking_block(text: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": text, "signature": sign(text)}


def redacted_thinking_block() -> dict[str, Any]:
    payload = base64.b64encode(f"redacted-{next(_ids)}-{secrets.token_hex(8)}".encode()).decode()
    return {"type": "redacted_thinking", "data": f"{payload}.{sign(payload)}"}


def _redacted_intact(data: object) -> bool:
    payload, _, signature = str(data).partition(".")
    return bool(payload) and signed(payload, signature)


def anthropic_thinking_problem(body: dict[str, Any]) -> str | None:
    """What the Messages API answers 400 to about thinking in `body`, or `None`."""
    thinking = body.get("thinking")
    enabled = isinstance(thinking, dict) and thinking.get("type") == "enabled"
    if enabled:
        budget = thinking.get("budget_tokens")  # type: ignore[union-attr]
        if not isinstance(budget, int) or budget < 1024:
            return "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"
        if budget >= int(body.get("max_tokens") or 0):
            return "`max_tokens` must be greater than `thinking.budget_tokens`."
        choice = body.get("tool_choice") or {}
        if choice.get("type") in ("any", "tool"):
            return "Thinking may not be enabled when tool_choice forces tool use."
    messages = body.get("messages") or []
    for i, message in enumerate(messages):
        content = message.get("content")
        if message.get("role") != "assistant" or not isinstance(content, list):
            continue
        for j, block in enumerate(content):
            if block.get("type") == "thinking" and not signed(
                str(block.get("thinking")), str(block.get("signature"))
            ):
                return f"messages.{i}.content.{j}: Invalid `signature` in `thinking` block"
            if block.get("type") == "redacted_thinking" and not _redacted_intact(block.get("data")):
                return f"messages.{i}.content.{j}: Invalid `data` in `redacted_thinking` block"
    if not enabled:
        return None
    # The final assistant turn of the current tool-use cycle: the one the last user turn's
    # tool results answer.
    if len(messages) < 2 or messages[-1].get("role") != "user":
        return None
    last_user = messages[-1].get("content")
    answers_tools = isinstance(last_user, list) and any(b.get("type") == "tool_result" for b in last_user)
    turn = messages[-2]
    content = turn.get("content")
    if not answers_tools or turn.get("role") != "assistant" or not isinstance(content, list) or not content:
        return None
    first = content[0].get("type")
    if first not in ("thinking", "redacted_thinking"):
        return (
            f"messages.{len(messages) - 2}.content.0.type: Expected `thinking` or `redacted_thinking`, but found "
            f"`{first}`. When `thinking` is enabled, a final `assistant` message must start with a thinking "
            "block (preceeding the lastmost set of `tool_use` and `tool_result` blocks). We recommend you "
            "include thinking blocks from previous turns. To avoid this requirement, disable `thinking`."
        )
    return None


# --- OpenAI Responses ------------------------------------------------------------------------


def is_reasoning_model(model: object) -> bool:
    name = str(model)
    return name.startswith(("o1", "o3", "o4", "gpt-5"))


def reasoning_item(summary: str) -> dict[str, Any]:
    """A `reasoning` output item with `encrypted_content` (what `include:
    ["reasoning.encrypted_content"]` returns with `store: false`)."""
    item_id = f"rs_fake{next(_ids)}"
    sealed = base64.b64encode(json.dumps({"id": item_id, "summary": summary}).encode()).decode()
    return {
        "id": item_id,
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": summary}],
        "encrypted_content": f"{sealed}.{sign(sealed)}",
    }


def _encrypted_intact(item: dict[str, Any]) -> bool:
    sealed, _, signature = str(item.get("encrypted_content") or "").partition(".")
    if not sealed or not signed(sealed, signature):
        return False
    return bool(json.loads(base64.b64decode(sealed)).get("id") == item.get("id"))


def validate_responses(body: dict[str, Any]) -> str | None:
    """The first problem the Responses API would reject `body` for, or `None`."""
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "Missing required parameter: 'model'."
    for tool in body.get("tools") or ():
        if tool.get("type") != "function" or not tool.get("name"):
            return "Invalid 'tools': each function tool must be {'type': 'function', 'name': ...}"
        if tool.get("strict") and not _strict_schema(tool.get("parameters")):
            return (
                f"Invalid schema for function '{tool['name']}': In context=(), 'additionalProperties' is required "
                "to be supplied and to be false, and 'required' must include every property."
            )
    items = body.get("input")
    if isinstance(items, str):
        return None
    if not isinstance(items, list) or not items:
        return "Invalid 'input': expected a string or a non-empty array of input items."
    reasoning_model = is_reasoning_model(body["model"])
    calls: set[str] = set()
    reasoned = False  # a reasoning item precedes the current run of output items
    for i, item in enumerate(items):
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "reasoning":
            following = items[i + 1] if i + 1 < len(items) else {}
            if following.get("type") not in ("function_call", "message") or not following.get("id"):
                return f"Item '{item.get('id')}' of type 'reasoning' was provided without its required following item."
            if not item.get("encrypted_content") and body.get("store") is False:
                return f"Item with id '{item.get('id')}' not found. Items are not persisted when `store` is set to false."
            if item.get("encrypted_content") and not _encrypted_intact(item):
                return f"input[{i}]: The encrypted content for item {item.get('id')} could not be verified."
            reasoned = True
        elif kind == "function_call":
            if reasoning_model and not reasoned:
                return (
                    f"input[{i}]: Item of type 'function_call' (call_id {item.get('call_id')}) was provided "
                    "without its required 'reasoning' item."
                )
            calls.add(str(item.get("call_id")))
        elif kind == "function_call_output":
            if item.get("call_id") not in calls:
                return f"No tool call found for function call output with call_id {item.get('call_id')}."
            reasoned = False
        elif kind == "message":
            if item.get("role") not in ("user", "assistant", "system", "developer"):
                return f"Invalid value for 'input[{i}].role': {item.get('role')!r}"
            if item.get("role") != "assistant":
                reasoned = False
        else:
            return f"Invalid value for 'input[{i}].type': {kind!r}"
    return None


def _strict_schema(schema: object) -> bool:
    if not isinstance(schema, dict):
        return True
    properties = schema.get("properties")
    if schema.get("type") == "object" or properties is not None:
        if schema.get("additionalProperties") is not False:
            return False
        if set(schema.get("required") or ()) != set(properties or {}):
            return False
        return all(_strict_schema(p) for p in (properties or {}).values())
    return _strict_schema(schema.get("items"))


# --- answers shaped as the APIs shape them -------------------------------------------------


def anthropic_answer(request: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    """A scripted Messages answer as the API would give it for `request`: with thinking enabled
    it starts with a signed thinking block (one is added when the script has none, its tokens
    counted as output); without thinking it has none."""
    thinking = request.get("thinking")
    enabled = isinstance(thinking, dict) and thinking.get("type") == "enabled"
    content = list(answer.get("content") or ())
    has_thinking = any(b.get("type") in ("thinking", "redacted_thinking") for b in content)
    if enabled and not has_thinking:
        text = f"Thinking it over ({next(_ids)})."
        tokens = max(1, len(text) // 4)
        usage = dict(answer.get("usage") or {})
        usage["output_tokens"] = int(usage.get("output_tokens") or 0) + tokens
        usage["output_tokens_details"] = {"thinking_tokens": tokens}
        return {**answer, "content": [thinking_block(text), *content], "usage": usage}
    if not enabled and has_thinking:
        kept = [b for b in content if b.get("type") not in ("thinking", "redacted_thinking")]
        return {**answer, "content": kept}
    return answer


def responses_answer(request: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    """A scripted Responses answer as the API would give it for `request`: a reasoning model's
    output starts with a reasoning item (one is added when the script has none), whose
    `encrypted_content` is there only when the request included `reasoning.encrypted_content`;
    other models have no reasoning items."""
    output = list(answer.get("output") or ())
    if not is_reasoning_model(request.get("model")):
        return {**answer, "output": [i for i in output if i.get("type") != "reasoning"]}
    usage = answer.get("usage")
    if not any(i.get("type") == "reasoning" for i in output):
        output.insert(0, reasoning_item("Working out the next step."))
        if isinstance(usage, dict):  # its tokens are output tokens too
            details = dict(usage.get("output_tokens_details") or {})
            details["reasoning_tokens"] = int(details.get("reasoning_tokens") or 0) + 7
            usage = {
                **usage,
                "output_tokens": int(usage.get("output_tokens") or 0) + 7,
                "output_tokens_details": details,
            }
            usage["total_tokens"] = int(usage.get("input_tokens") or 0) + usage["output_tokens"]
    if "reasoning.encrypted_content" not in (request.get("include") or ()):
        output = [{k: v for k, v in i.items() if k != "encrypted_content"} for i in output]
    return {**answer, "output": output, "usage": usage}
