"""The fake LLM server's enforcing mode: an organisation's rate limits, as the providers apply them.

`requests` and `tokens` per `window_s`, each a token bucket refilled continuously up to its limit
(Anthropic documents this algorithm; OpenAI's limits also replenish continuously). A request is
charged one request and its estimated tokens when it arrives (characters / 4 of its messages plus
its `max_tokens`, as OpenAI estimates), then corrected to the usage its answer reports. Beyond
either bucket it is answered 429 with `retry-after` / `retry-after-ms` and the
`x-ratelimit-remaining-*` headers, in the route's error shape, and not served.

    server.rate_limit = FakeRateLimit(requests=600, tokens=100_000, window_s=10)
    ...
    assert server.rate_limit.refused == 0
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any, NamedTuple

from stevora.testing.fake_stream import FakeResponse, Kind


class Decision(NamedTuple):
    at: float  # time.monotonic() of the request's arrival
    status: int  # 200 (served) or 429
    tokens: int  # its estimate


def request_tokens(kind: Kind, body: dict[str, Any]) -> int:
    """Characters / 4 of the messages (texts, tool arguments and results) plus `max_tokens`."""
    chars = 0
    if kind == "anthropic" and isinstance(body.get("system"), str):
        chars += len(body["system"])
    for message in body.get("messages") or ():
        content = message.get("content")
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):
            for block in content:
                for key in ("text", "content"):
                    if isinstance(block.get(key), str):
                        chars += len(block[key])
                if block.get("type") == "tool_use":
                    chars += len(str(block.get("input")))
        for call in message.get("tool_calls") or ():
            chars += len(str((call.get("function") or {}).get("arguments") or ""))
    limit = body.get("max_completion_tokens") or body.get("max_tokens") or 0
    return chars // 4 + int(limit)


def answer_tokens(answer: FakeResponse) -> int | None:
    """The usage an answer reports (prompt + completion), or None when it reports none."""
    usage = (answer.body or {}).get("usage")
    if not isinstance(usage, dict):
        return None
    if "prompt_tokens" in usage:
        return int(usage.get("prompt_tokens") or 0) + int(usage.get("completion_tokens") or 0)
    return int(usage.get("input_tokens") or 0) + int(usage.get("output_tokens") or 0)


class FakeRateLimit:
    """Two continuously refilled buckets shared by both routes, and a log of every decision."""

    def __init__(self, *, requests: int, tokens: int, window_s: float = 60.0) -> None:
        self.requests_limit = requests
        self.tokens_limit = tokens
        self.window_s = window_s
        self._requests = float(requests)
        self._tokens = float(tokens)
        self._at = time.monotonic()
        self._lock = threading.Lock()
        self.log: list[Decision] = []

    @property
    def served(self) -> int:
        return sum(1 for d in self.log if d.status == 200)

    @property
    def refused(self) -> int:
        return sum(1 for d in self.log if d.status == 429)

    def admit(self, kind: Kind, body: dict[str, Any]) -> tuple[FakeResponse | None, int]:
        """(a 429 answer or None when served, the request's estimated tokens)."""
        cost = request_tokens(kind, body)
        with self._lock:
            now = time.monotonic()
            self._refill(now)
            if self._requests >= 1 and self._tokens >= cost:
                self._requests -= 1
                self._tokens -= cost
                self.log.append(Decision(now, 200, cost))
                return None, cost
            self.log.append(Decision(now, 429, cost))
            wait_s = max(
                (1 - self._requests) * self.window_s / self.requests_limit,
                (cost - self._tokens) * self.window_s / self.tokens_limit,
                0.0,
            )
            remaining = (max(0, math.floor(self._requests)), max(0, math.floor(self._tokens)))
        headers = {
            "retry-after": str(max(1, math.ceil(wait_s))),
            "retry-after-ms": f"{wait_s * 1000:.0f}",
            "x-ratelimit-limit-requests": str(self.requests_limit),
            "x-ratelimit-limit-tokens": str(self.tokens_limit),
            "x-ratelimit-remaining-requests": str(remaining[0]),
            "x-ratelimit-remaining-tokens": str(remaining[1]),
        }
        return FakeResponse(status=429, headers=headers, error_message="Rate limit reached"), cost

    def settle(self, reserved: int, answer: FakeResponse) -> None:
        """Charge what the answer reports instead of the estimate (an error answer keeps it)."""
        used = answer_tokens(answer)
        if used is None or answer.status != 200:
            return
        with self._lock:
            self._tokens = min(float(self.tokens_limit), self._tokens + reserved - used)

    def _refill(self, now: float) -> None:
        elapsed = now - self._at
        self._at = now
        self._requests = min(
            float(self.requests_limit), self._requests + elapsed * self.requests_limit / self.window_s
        )
        self._tokens = min(
            float(self.tokens_limit), self._tokens + elapsed * self.tokens_limit / self.window_s
        )
