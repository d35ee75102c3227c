"""A `tools/call` result as Stevora keeps it: the trace's output and the text the model reads.

The output is what the model reads back, also on a resumed step (whose transcript is rebuilt
from the trace): plain text when the server answered only text; its `structuredContent` when it
gave one alongside text (the text is then, by the MCP spec, that same value serialised); else
`{"content": [...], "structuredContent": ...}`. Binary content (images, audio, blob resources) is
never inlined: its bytes are stored once, by content hash (`mcp_blobs`), and the block carries
`{"type": "image", "mimeType": ..., "bytes": n, "sha256": ...}`. A result with `isError` is a
failed call whose text the model reads. Everything here is the server's word: hostile input.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass, field
from typing import Any

from mcp_types import (
    AudioContent,
    BlobResourceContents,
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
)

MAX_ERROR_CHARS = 4_000


@dataclass(frozen=True)
class Blob:
    sha256: str
    mime_type: str
    data: bytes


@dataclass
class ConvertedResult:
    is_error: bool
    output: Any  # the trace's output (a completed call)
    error_text: str  # the text of a failed call
    blobs: list[Blob] = field(default_factory=list)


def convert_result(result: CallToolResult) -> ConvertedResult:
    blocks: list[dict[str, Any]] = []
    blobs: list[Blob] = []
    texts: list[str] = []
    for item in result.content:
        if isinstance(item, TextContent):
            texts.append(item.text)
            blocks.append({"type": "text", "text": item.text})
        elif isinstance(item, ImageContent | AudioContent):
            blocks.append(_binary(item.type, item.mime_type, item.data, blobs))
        elif isinstance(item, EmbeddedResource):
            res = item.resource
            if isinstance(res, BlobResourceContents):
                block = _binary("resource", res.mime_type or "application/octet-stream", res.blob, blobs)
                blocks.append({**block, "uri": str(res.uri)})
            else:
                blocks.append(
                    {"type": "resource", "uri": str(res.uri), "mimeType": res.mime_type, "text": res.text}
                )
        elif isinstance(item, ResourceLink):
            blocks.append(
                {"type": "resource_link", "uri": str(item.uri), "name": item.name, "mimeType": item.mime_type}
            )
    only_text = len(texts) == len(blocks)
    if result.is_error:
        text = "\n".join(texts) if texts else "The MCP tool reported an error"
        return ConvertedResult(True, None, text[:MAX_ERROR_CHARS], blobs)
    structured = result.structured_content
    if only_text and structured is None:
        return ConvertedResult(False, "\n".join(texts), "", blobs)
    if only_text:
        return ConvertedResult(False, structured, "", blobs)
    output: dict[str, Any] = {"content": blocks}
    if structured is not None:
        output["structuredContent"] = structured
    return ConvertedResult(False, output, "", blobs)


def _binary(kind: str, mime_type: str, data: str, blobs: list[Blob]) -> dict[str, Any]:
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return {"type": kind, "mimeType": mime_type, "error": "content is not valid base64"}
    digest = hashlib.sha256(raw).hexdigest()
    if all(b.sha256 != digest for b in blobs):
        blobs.append(Blob(digest, mime_type[:200], raw))
    return {"type": kind, "mimeType": mime_type, "bytes": len(raw), "sha256": digest}
