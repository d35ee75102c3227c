"""Images and files in requests to the fake provider servers, checked as the real APIs check them.

Chat Completions: a user message's content parts are `text`, `image_url` (`url`: a `data:` URL
with base64 or an http(s) URL) and `file` (`file_data` as a data URL, or `file_id`); a `tool`
message takes text only (a string or `text` parts). Messages: `image` blocks (`source`: base64 with
an image media type, or `url`) and `document` blocks (base64 PDF), in user turns and inside a
`tool_result`'s content. Responses: `input_text`, `input_image` and `input_file` parts in
messages and in a `function_call_output`'s `output`. Anything else is the provider's 400.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

_IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
_DATA_URL = re.compile(r"^data:([a-z]+/[a-z0-9.+-]+);base64,([A-Za-z0-9+/]*={0,2})$")


def _base64_ok(data: object) -> bool:
    if not isinstance(data, str):
        return False
    try:
        base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


def content_problem(kind: str, body: dict[str, Any]) -> str | None:
    """The 400 the real API answers to the request's images and files, or None."""
    if kind == "responses":
        return _responses_problem(body)
    return _openai_problem(body) if kind == "openai" else _anthropic_problem(body)


def _responses_problem(body: dict[str, Any]) -> str | None:
    """Responses `input`: a message's content parts are `input_text`, `input_image` (with `detail`)
    and `input_file`; a `function_call_output`'s `output` is a string or a list of the same parts
    (`detail` optional there), as the installed SDK's types say."""
    items = body.get("input")
    for i, item in enumerate(items if isinstance(items, list) else ()):
        if item.get("type") == "function_call_output":
            output = item.get("output")
            if isinstance(output, str):
                continue
            if not isinstance(output, list):
                return f"Invalid type for 'input[{i}].output': expected a string or an array of content parts"
            parts, where, in_message = output, f"input[{i}].output", False
        elif "role" in item and isinstance(item.get("content"), list) and item.get("role") != "assistant":
            parts, where, in_message = item["content"], f"input[{i}].content", True
        else:
            continue
        for j, part in enumerate(parts):
            problem = _responses_part_problem(f"{where}[{j}]", part, in_message=in_message)
            if problem:
                return problem
    return None


def _responses_part_problem(where: str, part: Any, *, in_message: bool) -> str | None:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "input_text":
        return None if isinstance(part.get("text"), str) else f"Missing required parameter: '{where}.text'."
    if kind == "input_image":
        if in_message and part.get("detail") not in ("low", "high", "auto", "original"):
            return f"Missing required parameter: '{where}.detail'."
        url = str(part.get("image_url") or "")
        found = _DATA_URL.match(url)
        if part.get("file_id") is not None or url.startswith(("http://", "https://")):
            return None
        if found is None or found.group(1) not in _IMAGE_TYPES or not _base64_ok(found.group(2)):
            return f"Invalid '{where}.image_url': expected an http(s) URL or a base64 image data URL"
        return None
    if kind == "input_file":
        found = _DATA_URL.match(str(part.get("file_data", "")))
        if (
            part.get("file_id") is None
            and part.get("file_url") is None
            and (found is None or not _base64_ok(found.group(2)) or not part.get("filename"))
        ):
            return f"Invalid '{where}': expected file_id, file_url, or file_data as a base64 data URL with a filename"
        return None
    return f"Invalid value for '{where}.type': {kind!r}"


def _openai_problem(body: dict[str, Any]) -> str | None:
    for i, message in enumerate(body.get("messages") or ()):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            where = f"messages[{i}].content[{j}]"
            kind = part.get("type") if isinstance(part, dict) else None
            if message.get("role") in ("tool", "assistant", "system") and kind != "text":
                return f"Invalid '{where}.type': a {message.get('role')} message's content parts must be text"
            if kind == "image_url":
                url = str((part.get("image_url") or {}).get("url", ""))
                found = _DATA_URL.match(url)
                if url.startswith(("http://", "https://")):
                    continue
                if found is None or found.group(1) not in _IMAGE_TYPES or not _base64_ok(found.group(2)):
                    return (
                        f"Invalid '{where}.image_url.url': expected an http(s) URL or a base64 image data URL"
                    )
            elif kind == "file":
                file = part.get("file") or {}
                found = _DATA_URL.match(str(file.get("file_data", "")))
                if file.get("file_id") is None and (found is None or not _base64_ok(found.group(2))):
                    return f"Invalid '{where}.file': expected file_id or file_data as a base64 data URL"
            elif kind != "text":
                return f"Invalid value for '{where}.type': {kind!r}"
    return None


def _anthropic_problem(body: dict[str, Any]) -> str | None:
    for i, message in enumerate(body.get("messages") or ()):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for j, block in enumerate(content):
            where = f"messages.{i}.content.{j}"
            inner = block.get("content") if block.get("type") == "tool_result" else None
            blocks = [(where, block)] + [
                (f"{where}.content.{k}", sub)
                for k, sub in enumerate(inner if isinstance(inner, list) else ())
            ]
            for place, item in blocks:
                problem = _anthropic_block_problem(
                    place, item, in_assistant=message.get("role") == "assistant"
                )
                if problem:
                    return problem
    return None


def _anthropic_block_problem(where: str, block: dict[str, Any], *, in_assistant: bool) -> str | None:
    kind = block.get("type")
    if kind not in ("image", "document"):
        return None
    if in_assistant:
        return f"{where}: {kind} blocks are not allowed in assistant messages"
    source = block.get("source") or {}
    if source.get("type") == "url" and kind == "image":
        return (
            None
            if str(source.get("url", "")).startswith(("http://", "https://"))
            else f"{where}.source.url: invalid"
        )
    if source.get("type") != "base64":
        return f"{where}.source.type: Input should be 'base64' or 'url'"
    allowed = _IMAGE_TYPES if kind == "image" else frozenset({"application/pdf"})
    if source.get("media_type") not in allowed:
        return f"{where}.source.media_type: Input should be one of {', '.join(sorted(allowed))}"
    if not _base64_ok(source.get("data")):
        return f"{where}.source.data: invalid base64 data"
    return None
