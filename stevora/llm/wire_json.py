"""A request body's JSON, the transcript's earlier turns not encoded again on every call.

A tool loop sends the same earlier turns round after round: each adapter keeps a message's wire
form on the message (`Message.wire_form`) as `Kept` dicts, and `body_json` writes a body with
each `Kept` dict's JSON, encoded on its first call, joined in. The bytes are what `ENCODER`
(the SDKs' encoding: `ensure_ascii=False`, separators `,` and `:`, no NaN) writes for the whole
body, member by member; about a third of the encoder's time for a 20-message transcript."""

from __future__ import annotations

from json import JSONEncoder
from typing import Any

# The SDKs' JSON encoding of a body (`anthropic._utils._json.openapi_dumps`, openai's the same).
ENCODER = JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


class Kept(dict[str, Any]):
    """A wire dict kept on its message (`Message.wire_form`), with its JSON once encoded. Never
    changed once made (`wire_form`'s contract): what changes (e.g. a cache breakpoint) is a new
    plain dict, encoded on each call."""

    __slots__ = ("json",)

    def __init__(self, value: dict[str, Any]) -> None:
        super().__init__(value)
        self.json: str | None = None


def item_json(value: Any) -> str:
    """`ENCODER.encode(value)`, kept on it when it is `Kept`."""
    if type(value) is Kept:
        if value.json is None:
            value.json = ENCODER.encode(value)
        return value.json
    text: str = ENCODER.encode(value)
    return text


def list_json(items: list[Any]) -> str:
    """`ENCODER.encode(items)`, each `Kept` item's JSON encoded once."""
    return (
        "["
        + ",".join(
            [item.json if type(item) is Kept and item.json is not None else item_json(item) for item in items]
        )
        + "]"
    )


def body_json(body: dict[str, Any], transcript: str, transcript_json: Any = list_json) -> bytes:
    """`ENCODER.encode(body).encode()`, the list under the key `transcript` written by
    `transcript_json` (default `list_json`), any other value by the encoder."""
    value = body.get(transcript)
    if type(value) is not list or any(type(key) is not str for key in body):
        return ENCODER.encode(body).encode()
    encode = ENCODER.encode
    members = [
        f"{_KEYS.get(key) or encode(key)}:{transcript_json(value) if key == transcript else encode(value)}"
        for key, value in body.items()
    ]
    return ("{" + ",".join(members) + "}").encode()


# The JSON of the body keys the adapters send, written once.
_KEYS = {
    key: ENCODER.encode(key)
    for key in (
        "max_tokens",
        "messages",
        "model",
        "stream",
        "system",
        "tools",
        "tool_choice",
        "temperature",
        "thinking",
        "output_config",
        "response_format",
        "parallel_tool_calls",
        "max_completion_tokens",
        "stream_options",
        "reasoning_effort",
        "prompt_cache_key",
    )
}
