"""The shared base model of every definition, and the retry policy every step type accepts.

`CamelModel` lives here because the retry policy is the leaf of the definition models: every
other module in the package imports this one, and this one imports none of them.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class CamelModel(BaseModel):
    """Base of all definition models: camelCase on the wire, snake_case in Python.

    Unknown fields are errors so that a typo (`maxToolRound`) is reported instead of silently
    ignored, and models are frozen because stored definitions are immutable.
    `model_dump(by_alias=True, exclude_none=True)` gives the wire JSON.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
    )


class RetryPolicy(CamelModel):
    """How often a failed step is retried and how long to wait in between (docs/retries.md)."""

    max_attempts: int = Field(default=3, ge=1, le=20)
    """Total attempts including the first: 3 means one try and two retries."""
    backoff_ms: int = Field(default=1000, ge=100)
    backoff_multiplier: float = Field(default=2.0, ge=1, le=10)
    # The original's zod schema does not accept this field; we do, because a per-step cap is
    # useful and harmless. It need not be >= backoff_ms (the cap simply wins).
    max_backoff_ms: int = Field(default=300_000, ge=100)


DEFAULT_RETRY_POLICY = RetryPolicy(
    max_attempts=3, backoff_ms=1000, backoff_multiplier=2.0, max_backoff_ms=300_000
)
"""The policy of every step type except `approval` when the step gives no `retry`."""

APPROVAL_RETRY_POLICY = DEFAULT_RETRY_POLICY.model_copy(update={"max_attempts": 1})
"""Approval steps are not retried unless the definition asks for it."""


def merge_retry_input(default: RetryPolicy, given: Any) -> Any:
    """Fill the fields a user's `retry` omits from the step type's default policy.

    Done at validation time (not lazily) so that the stored, fully dumped policy means the
    same thing when parsed again: an approval step's `{"backoffMs": 500}` keeps
    `maxAttempts: 1` after a round trip. Input that is neither a mapping nor a policy is
    returned unchanged for pydantic to reject.
    """
    if isinstance(given, RetryPolicy):
        return default.model_copy(update={k: getattr(given, k) for k in given.model_fields_set})
    if not isinstance(given, Mapping):
        return given
    merged: dict[str, Any] = dict(given)
    for name, field in RetryPolicy.model_fields.items():
        alias = field.alias or name
        if name not in given and alias not in given:
            merged[alias] = getattr(default, name)
    return merged


def compute_next_retry_delay_ms(
    policy: RetryPolicy, attempt: int, rand: Callable[[], float] = random.random
) -> int:
    """Milliseconds to wait before retrying after attempt number `attempt` (1-based) failed.

    ``base = min(backoff_ms * backoff_multiplier ** (attempt - 1), max_backoff_ms)``, then
    equal jitter of ±20 %: ``delay = base * (0.8 + 0.4 * rand())``, rounded, capped at
    `max_backoff_ms` and never below 0. Jitter keeps many runs that failed together (a
    provider outage) from retrying in lockstep. An `attempt` below 1 counts as 1.
    """
    exponent = max(attempt, 1) - 1
    try:
        growth = policy.backoff_multiplier**exponent
    except OverflowError:
        growth = float("inf")
    base = min(policy.backoff_ms * growth, float(policy.max_backoff_ms))
    delay = round(base * (0.8 + 0.4 * rand()))
    return max(0, min(delay, policy.max_backoff_ms))
