"""Images and files in conversations: `Image` / `File` for tool handlers, and the checks every
attachment passes wherever it comes from (a definition, a run's input, a tool, an MCP server).

Everything here is hostile input (docs/providers.md, "Images and files"): base64 is decoded
strictly (no whitespace, no junk, correct padding), the media type must be on the allow-list, and
the bytes must start the way that type's files do. An attachment is known by the SHA-256 of its
bytes: stored once per workspace (`blobs`), referenced by that hash everywhere else.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass, field
from typing import Any, Literal

AttachmentKind = Literal["image", "file"]

IMAGE_MEDIA_TYPES: frozenset[str] = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
FILE_MEDIA_TYPES: frozenset[str] = frozenset({"application/pdf"})
MEDIA_TYPES: dict[AttachmentKind, frozenset[str]] = {"image": IMAGE_MEDIA_TYPES, "file": FILE_MEDIA_TYPES}

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_BASE64 = re.compile(r"^[A-Za-z0-9+/]*={0,2}$")


class AttachmentError(ValueError):
    """An attachment that cannot be used; the message says why (the caller names the field)."""


def _magic_ok(media_type: str, data: bytes) -> bool:
    if media_type == "image/png":
        return data.startswith(b"\x89PNG\r\n\x1a\n")
    if media_type == "image/jpeg":
        return data.startswith(b"\xff\xd8\xff")
    if media_type == "image/gif":
        return data.startswith((b"GIF87a", b"GIF89a"))
    if media_type == "image/webp":
        return data[:4] == b"RIFF" and data[8:12] == b"WEBP"
    if media_type == "application/pdf":
        return data.startswith(b"%PDF-")
    return False


def decode_base64(text: str) -> bytes:
    """Strict base64: the standard alphabet, correct padding, nothing else (not even newlines)."""
    if len(text) % 4 or not _BASE64.fullmatch(text):
        raise AttachmentError("data is not valid base64 (standard alphabet, padded, no whitespace)")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise AttachmentError(f"data is not valid base64: {exc}") from exc


def is_sha256(value: object) -> bool:
    return isinstance(value, str) and _SHA256.fullmatch(value) is not None


@dataclass(frozen=True, slots=True)
class Attachment:
    """Checked bytes with their media type and content hash."""

    kind: AttachmentKind
    media_type: str
    data: bytes = field(repr=False)
    sha256: str

    @classmethod
    def of(
        cls, kind: AttachmentKind, media_type: str, data: bytes, *, max_bytes: int | None = None
    ) -> Attachment:
        """Check `data` as an attachment of `kind`; `AttachmentError` says what is wrong."""
        allowed = MEDIA_TYPES[kind]
        if media_type not in allowed:
            raise AttachmentError(
                f"mediaType '{media_type[:100]}' is not one of {', '.join(sorted(allowed))}"
            )
        if not data:
            raise AttachmentError("data is empty")
        if max_bytes is not None and len(data) > max_bytes:
            raise AttachmentError(
                f"the {kind} is {len(data)} bytes, over the {max_bytes}-byte limit per attachment"
            )
        if not _magic_ok(media_type, data):
            raise AttachmentError(f"the bytes are not a {media_type} file (their first bytes say otherwise)")
        return cls(kind, media_type, data, hashlib.sha256(data).hexdigest())

    def block(self) -> dict[str, object]:
        """How a tool's output and the trace name it: no bytes, only the hash."""
        return {
            "type": self.kind,
            "mediaType": self.media_type,
            "bytes": len(self.data),
            "sha256": self.sha256,
        }


@dataclass(frozen=True)
class Image:
    """An image a tool handler returns (alone, or inside a list or dict of its result).

    `media_type` is one of image/png, image/jpeg, image/gif, image/webp. The model gets it as an
    image (Anthropic: inside the tool result; OpenAI: in a user message after the tool results);
    the trace keeps `{"type": "image", "mediaType", "bytes", "sha256"}` and the bytes once.
    """

    data: bytes = field(repr=False)
    media_type: str = "image/png"
    kind: AttachmentKind = field(default="image", init=False)


@dataclass(frozen=True)
class File:
    """A file a tool handler returns (a PDF: `media_type="application/pdf"`); see `Image`."""

    data: bytes = field(repr=False)
    media_type: str = "application/pdf"
    kind: AttachmentKind = field(default="file", init=False)


class HasAttachments(Exception):
    """Raised by a JSON encoder's fallback that meets an `Image` or `File` in a tool's result."""


_MAX_WALK_DEPTH = 16


def with_attachment_blocks(value: Any, *, max_bytes: int | None) -> tuple[Any, tuple[Attachment, ...]]:
    """A tool's result with each `Image` / `File` (itself, or in its lists and dicts) replaced by
    its block (`Attachment.block`), and the checked attachments; `AttachmentError` if one fails."""
    found: dict[str, Attachment] = {}

    def walk(item: Any, depth: int) -> Any:
        if isinstance(item, Image | File):
            attachment = Attachment.of(item.kind, item.media_type, bytes(item.data), max_bytes=max_bytes)
            found.setdefault(attachment.sha256, attachment)
            return attachment.block()
        if depth >= _MAX_WALK_DEPTH:
            return item
        if isinstance(item, dict):
            return {key: walk(sub, depth + 1) for key, sub in item.items()}
        if isinstance(item, list | tuple):
            return [walk(sub, depth + 1) for sub in item]
        return item

    return walk(value, 0), tuple(found.values())


@dataclass(frozen=True, slots=True)
class AttachmentRef:
    """An image or file a stored value names by hash (a tool output's block, a message part)."""

    kind: AttachmentKind
    media_type: str
    sha256: str


def attachment_refs(value: Any, *, limit: int = 100) -> list[AttachmentRef]:
    """The attachment blocks in a JSON value: `{"type": "image" | "file", "mediaType"` (or MCP's
    `"mimeType"`) `, "sha256"}` with an allowed type and a well-formed hash, in order, at most `limit`."""
    found: list[AttachmentRef] = []

    def walk(item: Any, depth: int) -> None:
        if depth > 8 or len(found) >= limit:
            return
        if isinstance(item, dict):
            kind = item.get("type")
            media_type = item.get("mediaType", item.get("mimeType"))
            if kind in MEDIA_TYPES and is_sha256(item.get("sha256")) and media_type in MEDIA_TYPES[kind]:
                found.append(AttachmentRef(kind, media_type, item["sha256"]))
                return
            for sub in item.values():
                walk(sub, depth + 1)
        elif isinstance(item, list):
            for sub in item:
                walk(sub, depth + 1)

    walk(value, 0)
    return found
