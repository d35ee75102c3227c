"""Prefix caching in the fake provider servers, the way each provider documents it.

* **Anthropic** caches explicitly: a prefix up to a block marked `cache_control` is written to the
  cache (when it is at least `min_tokens` long) and a later request whose prefix is byte for byte
  the same up to one of *its* breakpoints, or up to a block boundary at most `lookback_blocks`
  before one, reads it. The prefix runs tools → system → messages, so a change anywhere (a tool's
  schema, one byte of an old tool result) misses everything after it. Usage reports the uncached
  rest as `input_tokens`, beside `cache_read_input_tokens` and `cache_creation_input_tokens`.
* **OpenAI** caches automatically: a prompt of at least `min_tokens` tokens shares the longest
  prefix it has in common with an earlier prompt of the same model and `prompt_cache_key`, in
  `increment`-token steps; usage reports it as `prompt_tokens_details.cached_tokens`.

Tokens are estimated as characters / 4 of each part's JSON (no tokenizer here); what matters is
that the same bytes give the same count and a different byte misses.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

CHARS_PER_TOKEN = 4


def _tokens(text: str) -> int:
    return len(text) // CHARS_PER_TOKEN


def _without_markers(value: Any) -> Any:
    """`value` with every `cache_control` key removed (a marker is not part of the cached bytes)."""
    if isinstance(value, dict):
        return {k: _without_markers(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_without_markers(v) for v in value]
    return value


def without_cache_markers(body: dict[str, Any]) -> dict[str, Any]:
    """A request body as the cache sees it: prompt-cache markers aside (for byte comparisons)."""
    out: dict[str, Any] = _without_markers(body)
    return out


@dataclass
class CacheLogEntry:
    kind: str
    prompt_tokens: int
    read_tokens: int
    write_tokens: int


@dataclass
class FakePromptCache:
    """The cache of one fake server (both APIs); `log` has one entry per answered request."""

    min_tokens: int = 1024
    lookback_blocks: int = 20
    increment: int = 128
    openai_history: int = 16  # earlier prompts kept per (model, prompt_cache_key)
    log: list[CacheLogEntry] = field(default_factory=list)
    _anthropic: set[str] = field(default_factory=set)
    _openai: dict[tuple[str, str | None], deque[str]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # -- Anthropic ---------------------------------------------------------------------------------

    def anthropic_usage(self, body: dict[str, Any]) -> dict[str, int]:
        """`input_tokens`, `cache_read_input_tokens`, `cache_creation_input_tokens` for `body`."""
        blocks = _anthropic_blocks(body)
        digest = hashlib.sha256(str(body.get("model", "")).encode())
        hashes: list[str] = []
        ends: list[int] = []  # cumulative tokens after each block
        total = 0
        breakpoints: list[int] = []
        for index, (block, marked) in enumerate(blocks):
            text = json.dumps(_without_markers(block), sort_keys=True, ensure_ascii=False)
            digest.update(text.encode())
            hashes.append(digest.copy().hexdigest())
            total += _tokens(text)
            ends.append(total)
            if marked:
                breakpoints.append(index)
        with self._lock:
            hit = -1
            for point in breakpoints:
                for index in range(point, max(-1, point - self.lookback_blocks - 1), -1):
                    if index > hit and hashes[index] in self._anthropic:
                        hit = index
                        break
            read = ends[hit] if hit >= 0 else 0
            write = 0
            cacheable = [p for p in breakpoints if ends[p] >= self.min_tokens]
            for point in cacheable:
                self._anthropic.add(hashes[point])
            if cacheable and cacheable[-1] > hit:
                write = ends[cacheable[-1]] - read
            self.log.append(CacheLogEntry("anthropic", total, read, write))
        return {
            "input_tokens": total - read - write,
            "cache_read_input_tokens": read,
            "cache_creation_input_tokens": write,
        }

    # -- OpenAI ------------------------------------------------------------------------------------

    def openai_usage(self, body: dict[str, Any]) -> tuple[int, int]:
        """(`prompt_tokens`, `cached_tokens`) for `body`."""
        prompt = _openai_prompt(body)
        total = _tokens(prompt)
        key = (str(body.get("model", "")), body.get("prompt_cache_key"))
        with self._lock:
            earlier = self._openai.setdefault(key, deque(maxlen=self.openai_history))
            common = max((_common_prefix(prompt, other) for other in earlier), default=0)
            earlier.append(prompt)
            cached = 0
            if total >= self.min_tokens:
                cached = (_tokens(prompt[:common]) // self.increment) * self.increment
                cached = cached if cached >= self.min_tokens else 0
            self.log.append(CacheLogEntry("openai", total, cached, 0))
        return total, cached


def _anthropic_blocks(body: dict[str, Any]) -> list[tuple[Any, bool]]:
    """The prompt in cache order (tools, system, messages) as (block, has a breakpoint) pairs."""
    out: list[tuple[Any, bool]] = []
    for tool in body.get("tools") or ():
        out.append((tool, "cache_control" in tool))
    system = body.get("system")
    if isinstance(system, str):
        out.append(({"type": "text", "text": system}, False))
    else:
        for block in system or ():
            out.append((block, "cache_control" in block))
    for message in body.get("messages") or ():
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
        for position, block in enumerate(blocks):
            # A message's role is part of its first block's bytes: the same text as a user's and
            # as an assistant's turn is not the same prefix.
            keyed = {"role": message.get("role"), **block} if position == 0 else block
            out.append((keyed, isinstance(block, dict) and "cache_control" in block))
    return out


def _openai_prompt(body: dict[str, Any]) -> str:
    """What OpenAI's automatic cache matches on: tools first, then the messages, in order."""
    parts = [json.dumps(body.get("tools") or [], sort_keys=True, ensure_ascii=False)]
    parts += [json.dumps(m, sort_keys=True, ensure_ascii=False) for m in body.get("messages") or ()]
    return "\n".join(parts)


def _common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of `a` and `b` (binary search over slices: C-speed compares)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low
