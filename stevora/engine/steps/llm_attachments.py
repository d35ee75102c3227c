"""The `llm` step's images and files: made from its messages, stored once, loaded for each call.

A message's parts name their bytes by SHA-256 only, in memory and in every row (the prompt in the
first call's `request.messages`, a tool's result in its trace); the bytes live once per workspace
in `blobs` (docs/providers.md, "Images and files"). Before each model call the transcript's
attachments get their bytes: those this execution made or read already from memory, the others
from `blobs` in one query, so a 1 MB image of a ten-round conversation is read at most once per
execution and stored once per workspace.

A tool result names its attachments as blocks of its output: `{"type": "image" | "file",
"mediaType" (or MCP's "mimeType"), "sha256", ...}`; they become the tool message's parts.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import TYPE_CHECKING, Any

import asyncpg

from stevora.attachments import Attachment, AttachmentError, attachment_refs, decode_base64
from stevora.db import blobs
from stevora.definitions import LlmStep, WorkflowDefinitionSpec
from stevora.errors import PayloadTooLarge, StevoraError, ValidationError
from stevora.llm.messages import Message, Part
from stevora.templating import MISSING, lookup, render_template

if TYPE_CHECKING:
    from stevora.settings import Settings

INVALID_ATTACHMENT = "INVALID_ATTACHMENT"


class InvalidAttachment(StevoraError):
    """An image or file of a step's messages that cannot be sent (not retryable: it would not change)."""

    code = INVALID_ATTACHMENT
    http_status = 400
    retryable = False


def render_parts(
    step: LlmStep,
    index: int,
    content: list[Any],
    *,
    input: dict[str, Any],
    state: dict[str, Any],
    max_bytes: int,
) -> Message:
    """A user message whose content is a list of parts, templates rendered and attachments checked."""
    parts: list[Part] = []
    for i, part in enumerate(content):
        where = f"messages[{index}].content[{i}]"
        if part.type == "text":
            parts.append(Part("text", text=render_template(part.text, input=input, state=state)))
            continue
        if getattr(part, "url", None) is not None:
            url = render_template(part.url, input=input, state=state)
            if not url.startswith(("https://", "http://")):
                raise InvalidAttachment(f"{where}.url: an image url is http(s) (got '{url[:100]}')")
            parts.append(Part("image", url=url))
            continue
        media_type = render_template(part.media_type or "", input=input, state=state)
        try:
            data = decode_base64(render_template(part.data, input=input, state=state))
            found = Attachment.of(part.type, media_type, data, max_bytes=max_bytes)
        except AttachmentError as exc:
            raise InvalidAttachment(f"{where}.data: {exc}", details={"field": f"{where}.data"}) from exc
        parts.append(Part(found.kind, media_type=found.media_type, sha256=found.sha256, data=found.data))
    text = "\n".join(p.text or "" for p in parts if p.type == "text")
    return Message(role="user", content=text, parts=tuple(parts))


def tool_attachments(text: str) -> tuple[Part, ...]:
    """The attachment blocks a tool result's JSON names (none for most results: a quick look first)."""
    if '"sha256"' not in text:
        return ()
    try:
        value = json.loads(text)
    except ValueError:
        return ()
    return tuple(
        Part(ref.kind, media_type=ref.media_type, sha256=ref.sha256) for ref in attachment_refs(value)
    )


class ConversationAttachments:
    """One step execution's attachments: the bytes it has seen, by hash, and what it stored."""

    def __init__(self, pool: asyncpg.Pool, workspace_id: str, max_total_bytes: int) -> None:
        self.pool = pool
        self.workspace_id = workspace_id
        self.max_total_bytes = max_total_bytes
        self._bytes: dict[str, bytes] = {}
        self._stored: set[str] = set()
        self._tool_parts: dict[str, tuple[Part, ...]] = {}
        self._scanned = 0  # messages of the transcript looked at by `any_in`
        self._any = False

    def any_in(self, transcript: list[Message]) -> bool:
        """Whether the conversation names any image or file: only the messages added since the
        last look are looked at, so a conversation without any costs nothing per round."""
        if not self._any:
            for message in transcript[self._scanned :]:
                if message.parts or (message.role == "tool" and '"sha256"' in (message.content or "")):
                    self._any = True
                    break
            self._scanned = len(transcript)
        return self._any

    async def store(self, messages: list[Message]) -> None:
        """The bytes of new parts (a rendered prompt) into `blobs`, before the call that stores the
        messages naming them is checkpointed."""
        new = [
            Attachment(p.type, p.media_type or "", p.data, p.sha256)  # type: ignore[arg-type]
            for m in messages
            for p in m.attachments
            if p.data is not None and p.sha256 is not None and p.sha256 not in self._stored
        ]
        for attachment in new:
            self._bytes[attachment.sha256] = attachment.data
        await blobs.store(self.pool, self.workspace_id, new)
        self._stored.update(a.sha256 for a in new)

    async def loaded(self, messages: list[Message]) -> list[Message]:
        """`messages` with every attachment's bytes (tool results' attachments made parts first)."""
        with_parts = [self._with_tool_parts(m) for m in messages]
        wanted = {p.sha256 for m in with_parts for p in m.attachments if p.sha256 and p.data is None}
        missing = wanted - set(self._bytes)
        if missing:
            for sha, (_, data) in (await blobs.load(self.pool, self.workspace_id, missing)).items():
                self._bytes[sha] = data
        total = sum(len(self._bytes.get(sha, b"")) for sha in wanted | self._in_parts(with_parts))
        if total > self.max_total_bytes:
            raise InvalidAttachment(
                f"the conversation's images and files are {total} bytes, over the "
                f"{self.max_total_bytes}-byte limit (STEVORA_MAX_RUN_ATTACHMENT_BYTES)"
            )
        return [self._filled(m) for m in with_parts]

    @staticmethod
    def _in_parts(messages: list[Message]) -> set[str]:
        return {p.sha256 for m in messages for p in m.attachments if p.sha256}

    def _with_tool_parts(self, message: Message) -> Message:
        if message.role != "tool" or message.parts or not message.content:
            return message
        parts = self._tool_parts.get(message.content)
        if parts is None:
            parts = self._tool_parts[message.content] = tool_attachments(message.content)
        return dataclasses.replace(message, parts=parts) if parts else message

    def _filled(self, message: Message) -> Message:
        if not message.attachments:
            return message
        parts = []
        for part in message.parts:
            if part.type != "text" and part.data is None and part.sha256 is not None:
                data = self._bytes.get(part.sha256)
                part = (
                    dataclasses.replace(part, data=data)
                    if data is not None
                    else Part("text", text=f"(attachment {part.sha256[:12]} is not stored in this workspace)")
                )
            parts.append(part)
        return dataclasses.replace(message, parts=tuple(parts))


_INPUT_TEMPLATE = re.compile(r"^\{\{\s*input\.([A-Za-z0-9_$.\-]+)\s*\}\}$")


def check_input_attachments(spec: WorkflowDefinitionSpec, input: dict[str, Any], settings: Settings) -> None:
    """The run input's fields that `llm` steps send as images or files (a part's `data` that is
    exactly `{{input.<path>}}`), checked when the run is created: a 400 naming `input.<path>` for
    data that is not strict base64 of an allowed type, a 413 for one over
    `STEVORA_MAX_ATTACHMENT_BYTES` or for all of them over `STEVORA_MAX_RUN_ATTACHMENT_BYTES`."""
    sizes: dict[str, int] = {}
    problems: list[dict[str, str]] = []
    for step in spec.steps:
        if not isinstance(step, LlmStep):
            continue
        for message in step.messages:
            for part in message.content if isinstance(message.content, list) else ():
                if part.type == "text":
                    continue
                found = _INPUT_TEMPLATE.match(part.data or "")
                if found is None:
                    continue
                path = f"input.{found.group(1)}"
                value = lookup(input, found.group(1).split("."))
                if value is MISSING or path in sizes:
                    continue  # missing: the template renders empty and the step says so
                media_type = render_template(part.media_type or "", input=input, state={})
                try:
                    if not isinstance(value, str):
                        raise AttachmentError("expected a base64 string")
                    data = decode_base64(value)
                    sizes[path] = len(data)
                    Attachment.of(part.type, media_type, data, max_bytes=settings.max_attachment_bytes)
                except AttachmentError as exc:
                    if path in sizes and sizes[path] > settings.max_attachment_bytes:
                        raise _too_large(
                            path, sizes[path], settings.max_attachment_bytes, "STEVORA_MAX_ATTACHMENT_BYTES"
                        ) from exc
                    problems.append({"path": path, "message": str(exc)})
    if problems:
        raise ValidationError.from_problems(problems, message="Invalid run input: " + problems[0]["message"])
    total = sum(sizes.values())
    if total > settings.max_run_attachment_bytes:
        raise _too_large(
            "input", total, settings.max_run_attachment_bytes, "STEVORA_MAX_RUN_ATTACHMENT_BYTES"
        )


def _too_large(path: str, size: int, limit: int, setting: str) -> PayloadTooLarge:
    message = f"{path}: images and files of {size} bytes, over the {limit}-byte limit ({setting})"
    return PayloadTooLarge(
        message, details={"errors": [{"path": path, "message": message}], "bytes": size, "limitBytes": limit}
    )
