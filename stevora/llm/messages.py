"""Provider-neutral conversation types: what the tool loop builds and every adapter translates.

Plain slotted dataclasses with a JSON round trip (`to_dict` / `from_dict`, snake_case keys), so
the engine can store a request or a response in a row and rebuild it on replay.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, cast


class StreamSink(Protocol):
    """Who hears a streamed call as it happens (the engine: TTFT and live text deltas); given to an
    adapter on `LlmRequest.sink`, fed by `stevora.llm.streaming`."""

    def first_token(self) -> None:
        """The first content or tool-call delta arrived."""

    def text(self, piece: str) -> None:
        """A piece of the answer's text, in order."""


Role = Literal["system", "user", "assistant", "tool"]
ReasoningKind = Literal["anthropic", "openai_responses", "openai_item_ids"]
"""`openai_item_ids`: the Responses ids of a turn's output items (`{"message": id, "calls": {call_id:
id}}`), so the items that follow a reasoning item go back as the API wrote them."""
_REASONING_KINDS: frozenset[str] = frozenset({"anthropic", "openai_responses", "openai_item_ids"})
OpenAIApi = Literal["chat", "responses"]
ResponseFormat = Literal["json", "text"]
ToolChoiceMode = Literal["auto", "required", "none"]
StructuredOutput = Literal["native", "tool", "prompt"]

_ROLES: frozenset[str] = frozenset({"system", "user", "assistant", "tool"})


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One function call the model asked for. `arguments` is the raw JSON string it produced."""

    id: str
    name: str
    arguments: str

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "arguments": self.arguments}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ToolCall:
        return cls(id=str(data["id"]), name=str(data["name"]), arguments=str(data.get("arguments", "")))


PartType = Literal["text", "image", "file"]


@dataclass(frozen=True, slots=True)
class Part:
    """One piece of a message's content: text, an image or a file (a PDF).

    An image or file is known by the SHA-256 of its bytes (stored once, in the `blobs` table) or
    by a `url` (images only); `data` holds the bytes while they are in memory and is never part of
    the stored form (`to_dict`), so checkpoints carry the hash alone.
    """

    type: PartType
    text: str | None = None
    media_type: str | None = None
    sha256: str | None = None
    url: str | None = None
    data: bytes | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        if self.type == "text":
            return {"type": "text", "text": self.text or ""}
        if self.url is not None:
            return {"type": self.type, "url": self.url}
        return {"type": self.type, "mediaType": self.media_type, "sha256": self.sha256}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Part:
        kind = cast(PartType, data["type"])
        if kind == "text":
            return cls("text", text=str(data.get("text") or ""))
        return cls(kind, media_type=data.get("mediaType"), sha256=data.get("sha256"), url=data.get("url"))


@dataclass(frozen=True, slots=True)
class ReasoningItem:
    """An opaque piece of an assistant turn's reasoning that must go back to the API that wrote it,
    unchanged, on every later round: an Anthropic `thinking` / `redacted_thinking` block (with its
    signature) or an OpenAI Responses `reasoning` item (with its `encrypted_content`).

    `data` is the item's JSON text as it was first serialized, kept as a string from the answer
    to the stored row and back, so a resumed, forked or replayed round sends the same bytes.
    `kind` says which API can read it: an adapter sends only its own kind (a fallback model of
    another provider gets the turn without it).
    """

    kind: ReasoningKind
    data: str

    @classmethod
    def of(cls, kind: ReasoningKind, item: Mapping[str, Any]) -> ReasoningItem:
        # ASCII-escaped: the text holds no character PostgreSQL refuses (NUL, a lone surrogate), so
        # it is stored as it is and parses back to exactly the item the API sent.
        return cls(kind, json.dumps(item, separators=(",", ":")))

    def item(self) -> dict[str, Any]:
        """The item as the API's JSON object (a fresh dict each call); `{}` for text that is not
        a JSON object (adapters send no such item)."""
        try:
            value = json.loads(self.data)
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "data": self.data}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReasoningItem:
        return cls(kind=cast(ReasoningKind, str(data["kind"])), data=str(data["data"]))


def reasoning_of(items: object) -> tuple[ReasoningItem, ...]:
    """Stored reasoning items (`[{"kind", "data"}]`) back as `ReasoningItem`s; anything else: none."""
    if not isinstance(items, list):
        return ()
    return tuple(
        ReasoningItem.from_dict(i)
        for i in items
        if isinstance(i, Mapping) and i.get("kind") in _REASONING_KINDS and isinstance(i.get("data"), str)
    )


@dataclass(frozen=True, slots=True)
class Message:
    """One conversation turn. Tool results are `role="tool"` messages carrying `tool_call_id`.

    `parts`, when present, is the content in order (text, images, files) and `content` its text;
    adapters that see `parts` send them instead of `content` (docs/providers.md, "Images and files").
    """

    role: Role
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    is_error: bool = False
    reasoning: tuple[ReasoningItem, ...] = ()
    """An assistant turn's opaque reasoning (thinking blocks, reasoning items), sent back before
    its text and tool calls to the API that wrote it."""
    parts: tuple[Part, ...] = ()
    _wire: dict[str, Any] | None = field(default=None, init=False, repr=False, compare=False)
    """Adapters' wire forms of this message, each made once (`wire_form`); never stored."""

    def __post_init__(self) -> None:
        if self.role not in _ROLES:
            raise ValueError(f"unknown message role {self.role!r}")
        if not isinstance(self.tool_calls, tuple):
            # Callers often pass a list; keep the dataclass hashable and immutable.
            object.__setattr__(self, "tool_calls", tuple(self.tool_calls))
        if not isinstance(self.reasoning, tuple):
            object.__setattr__(self, "reasoning", tuple(self.reasoning))
        if not isinstance(self.parts, tuple):
            object.__setattr__(self, "parts", tuple(self.parts))

    def wire_form(self, adapter: str, build: Callable[[Message], Any]) -> Any:
        """`build(self)`, made on the first call for `adapter` and kept on the message: a message
        is frozen (a changed one is a new object, `dataclasses.replace`), so its wire form cannot
        change, and the tool loop sends the same earlier turns round after round. The caller must
        not mutate what it gets (copy the containers it changes)."""
        cache = self._wire
        if cache is None:
            cache = {}
            object.__setattr__(self, "_wire", cache)
        elif adapter in cache:
            return cache[adapter]
        value = cache[adapter] = build(self)
        return value

    @property
    def attachments(self) -> tuple[Part, ...]:
        """The image and file parts."""
        return tuple(p for p in self.parts if p.type != "text")

    @classmethod
    def system(cls, content: str) -> Message:
        return cls(role="system", content=content)

    @classmethod
    def user(cls, content: str) -> Message:
        return cls(role="user", content=content)

    @classmethod
    def assistant(
        cls,
        content: str | None = None,
        tool_calls: tuple[ToolCall, ...] | list[ToolCall] = (),
        reasoning: tuple[ReasoningItem, ...] | list[ReasoningItem] = (),
    ) -> Message:
        return cls(
            role="assistant", content=content, tool_calls=tuple(tool_calls), reasoning=tuple(reasoning)
        )

    @classmethod
    def tool_result(
        cls, tool_call_id: str, content: str, *, name: str | None = None, is_error: bool = False
    ) -> Message:
        return cls(role="tool", content=content, tool_call_id=tool_call_id, name=name, is_error=is_error)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [call.to_dict() for call in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        if self.is_error:
            out["is_error"] = True
        if self.reasoning:
            out["reasoning"] = [r.to_dict() for r in self.reasoning]
        if self.parts:
            out["parts"] = [p.to_dict() for p in self.parts]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Message:
        return cls(
            role=cast(Role, data["role"]),
            content=data.get("content"),
            tool_calls=tuple(ToolCall.from_dict(c) for c in data.get("tool_calls") or ()),
            tool_call_id=data.get("tool_call_id"),
            name=data.get("name"),
            is_error=bool(data.get("is_error", False)),
            reasoning=reasoning_of(data.get("reasoning")),
            parts=tuple(Part.from_dict(p) for p in data.get("parts") or ()),
        )


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool the model may call: name, description and a JSON Schema for its arguments."""

    name: str
    description: str
    parameters: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "parameters": self.parameters}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ToolSpec:
        return cls(
            name=str(data["name"]),
            description=str(data.get("description", "")),
            parameters=dict(data.get("parameters") or {}),
        )


@dataclass(frozen=True, slots=True)
class NamedTool:
    """`tool_choice` that forces one call of the named tool."""

    name: str


ToolChoice = ToolChoiceMode | NamedTool
_TOOL_CHOICE_MODES: frozenset[str] = frozenset({"auto", "required", "none"})


def tool_choice_of(value: object) -> ToolChoice:
    """A `ToolChoice` from its JSON form (`"auto"`, `{"name": "x"}`) or a definition's value.

    Anything with a string `name` attribute (the step definition's named choice) forces that tool.
    """
    if isinstance(value, NamedTool):
        return value
    if isinstance(value, str) and value in _TOOL_CHOICE_MODES:
        return cast(ToolChoiceMode, value)
    name = value.get("name") if isinstance(value, Mapping) else getattr(value, "name", None)
    if isinstance(name, str) and name:
        return NamedTool(name)
    raise ValueError(f"invalid tool choice {value!r}: expected auto, required, none or {{'name': ...}}")


def tool_choice_to_json(choice: ToolChoice) -> str | dict[str, str]:
    return {"name": choice.name} if isinstance(choice, NamedTool) else choice


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts of one call, in the OpenTelemetry meaning.

    `input_tokens` is every prompt token, cache reads and writes included (for Anthropic the
    adapter adds them up); `cache_*` are subsets of it and `reasoning_tokens` a subset of
    `output_tokens`, so pricing can bill each part at its own rate.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        if not isinstance(other, Usage):
            return NotImplemented
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
            reasoning_tokens=self.reasoning_tokens + other.reasoning_tokens,
        )

    def to_dict(self) -> dict[str, int]:
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cache_read_tokens": self.cache_read_tokens,
            "cache_write_tokens": self.cache_write_tokens,
            "reasoning_tokens": self.reasoning_tokens,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Usage:
        return cls(**{key: int(data.get(key) or 0) for key in cls.__dataclass_fields__})


@dataclass(slots=True)
class LlmRequest:
    """Everything an adapter needs for one call (streamed or not: the adapter's setting)."""

    model: str
    messages: list[Message]
    tools: list[ToolSpec] = field(default_factory=list)
    temperature: float | None = None
    max_tokens: int | None = None
    response_format: ResponseFormat | None = None
    parallel_tool_calls: bool = True
    timeout_s: float | None = None
    output_schema: dict[str, Any] | None = None
    structured_output: StructuredOutput | None = None
    """With `output_schema`: the form asked for (`native`, `tool`, `prompt`); the adapter sends the
    best it can (stevora.llm.structured) and says on the response what it sent."""
    tool_choice: ToolChoice = "auto"
    """Only meaningful with `tools`; adapters leave it out of requests that carry none."""
    cache_key: str | None = None
    """Prompt caching is on for this request: the key that groups requests sharing a prefix (the
    run's id, or its thread's). Anthropic gets `cache_control` breakpoints, OpenAI `prompt_cache_key`;
    `None`: no cache hints at all (a step's `cache: false`)."""
    sink: StreamSink | None = field(default=None, repr=False, compare=False)
    """Hears a streamed answer's first token and text deltas; not part of the stored request."""
    api: OpenAIApi | None = None
    """Which OpenAI API an OpenAI-protocol adapter calls: Chat Completions or Responses (others
    ignore it); `None`: the provider's default API (docs/configuration.md)."""
    thinking_budget_tokens: int | None = None
    """Anthropic extended thinking: the step's `thinking.budgetTokens` (`None`: thinking off)."""
    reasoning_effort: str | None = None
    """OpenAI reasoning models: the step's `reasoning.effort` (`None`: the model's default)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "messages": [m.to_dict() for m in self.messages],
            "tools": [t.to_dict() for t in self.tools],
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "response_format": self.response_format,
            "parallel_tool_calls": self.parallel_tool_calls,
            "timeout_s": self.timeout_s,
            "output_schema": self.output_schema,
            "structured_output": self.structured_output,
            "tool_choice": tool_choice_to_json(self.tool_choice),
            "cache_key": self.cache_key,
            "api": self.api,
            "thinking_budget_tokens": self.thinking_budget_tokens,
            "reasoning_effort": self.reasoning_effort,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LlmRequest:
        return cls(
            model=str(data["model"]),
            messages=[Message.from_dict(m) for m in data.get("messages") or ()],
            tools=[ToolSpec.from_dict(t) for t in data.get("tools") or ()],
            temperature=data.get("temperature"),
            max_tokens=data.get("max_tokens"),
            response_format=data.get("response_format"),
            parallel_tool_calls=bool(data.get("parallel_tool_calls", True)),
            timeout_s=data.get("timeout_s"),
            output_schema=data.get("output_schema"),
            structured_output=data.get("structured_output"),
            tool_choice=tool_choice_of(data.get("tool_choice") or "auto"),
            cache_key=data.get("cache_key"),
            api=data["api"] if data.get("api") in ("chat", "responses") else None,
            thinking_budget_tokens=data.get("thinking_budget_tokens"),
            reasoning_effort=data.get("reasoning_effort"),
        )


@dataclass(slots=True)
class LlmResponse:
    """One model answer. `finish_reason` uses OpenAI's words (`stop`, `tool_calls`, `length`, ...)."""

    text: str | None
    tool_calls: list[ToolCall]
    usage: Usage
    model: str
    finish_reason: str
    response_id: str | None
    provider: str
    reasoning: list[ReasoningItem] = field(default_factory=list)
    """Thinking blocks / reasoning items of the answer, in the order the API sent them."""
    structured_output: str | None = None
    """The structured-output form the adapter sent (`native`, `tool`, `prompt`), if any."""
    structured_fallback: str | None = None
    """Why that is not the form the request asked for (None when it is)."""

    def to_message(self) -> Message:
        """The assistant turn to append to the conversation before running the tool calls."""
        return Message.assistant(self.text, tuple(self.tool_calls), tuple(self.reasoning))

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "tool_calls": [c.to_dict() for c in self.tool_calls],
            "usage": self.usage.to_dict(),
            "model": self.model,
            "finish_reason": self.finish_reason,
            "response_id": self.response_id,
            "provider": self.provider,
            "reasoning": [r.to_dict() for r in self.reasoning],
            "structured_output": self.structured_output,
            "structured_fallback": self.structured_fallback,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LlmResponse:
        return cls(
            text=data.get("text"),
            tool_calls=[ToolCall.from_dict(c) for c in data.get("tool_calls") or ()],
            usage=Usage.from_dict(data.get("usage") or {}),
            model=str(data.get("model", "")),
            finish_reason=str(data.get("finish_reason", "stop")),
            response_id=data.get("response_id"),
            provider=str(data.get("provider", "")),
            reasoning=list(reasoning_of(data.get("reasoning"))),
            structured_output=data.get("structured_output"),
            structured_fallback=data.get("structured_fallback"),
        )
