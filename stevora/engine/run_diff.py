"""Two runs side by side: their model calls aligned by step (and visit) and round, with the first
row where they differ marked (docs/time-travel.md, "Diff"). Shared by `stevora runs diff` and the
UI's diff view.

Pure: it reads attributes of what it is given (the client's `LlmCall` / `ToolTrace`, or the UI's
rows wrapped as `CallRow` / `TraceRow`) and imports nothing beyond the standard library, so the
`stevora` command of a client-only install can use it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol


class ModelCall(Protocol):
    """What the diff reads of a model call (`llm_calls` row)."""

    @property
    def id(self) -> str: ...
    @property
    def step_name(self) -> str: ...
    @property
    def round(self) -> int: ...
    @property
    def status(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def response(self) -> dict[str, Any] | None: ...
    @property
    def input_tokens(self) -> int: ...
    @property
    def output_tokens(self) -> int: ...
    @property
    def cost_usd(self) -> float: ...
    @property
    def duration_ms(self) -> float | None: ...


class ToolResult(Protocol):
    """What the diff reads of a tool call's record (`tool_trace` row)."""

    @property
    def llm_call_id(self) -> str | None: ...
    @property
    def sequence(self) -> int: ...
    @property
    def status(self) -> str: ...
    @property
    def output_json(self) -> Any: ...
    @property
    def error(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class CallRow:
    """A `llm_calls` row (any mapping) as a `ModelCall`."""

    id: str
    step_name: str
    round: int
    status: str
    model: str
    response: dict[str, Any] | None
    input_tokens: int
    output_tokens: int
    cost_usd: float
    duration_ms: float | None

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> CallRow:
        return cls(*(row[name] for name in cls.__slots__))


@dataclass(frozen=True, slots=True)
class TraceRow:
    """A `tool_trace` row (any mapping) as a `ToolResult`."""

    llm_call_id: str | None
    sequence: int
    status: str
    output_json: Any
    error: str | None

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> TraceRow:
        return cls(*(row[name] for name in cls.__slots__))


@dataclass
class Side:
    """One run's model call at a (step, visit, round) and the tool results it got."""

    model: str
    text: str | None
    tool_calls: list[tuple[str, Any]]  # (name, arguments)
    results: list[Any] = field(default_factory=list)
    tokens: int = 0
    cost_usd: float = 0.0
    duration_ms: float | None = None
    call_id: str = ""  # the llm_calls row (the UI links to its round)

    def content(self) -> tuple[Any, ...]:
        """What the comparison looks at: the model's text, its tool calls and the results."""
        return (
            self.text,
            json.dumps(self.tool_calls, sort_keys=True),
            json.dumps(self.results, sort_keys=True),
        )

    def view(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "text": self.text,
            "toolCalls": [{"name": n, "arguments": args} for n, args in self.tool_calls],
            "results": self.results,
            "tokens": self.tokens,
            "costUsd": self.cost_usd,
            "durationMs": self.duration_ms,
        }


@dataclass
class Row:
    """One aligned (step, visit, round): A's side, B's side (None where a run has no such call)."""

    step_name: str
    visit: int
    round: int
    a: Side | None
    b: Side | None
    same: bool
    first_divergence: bool

    def view(self) -> dict[str, Any]:
        return {
            "stepName": self.step_name,
            "visit": self.visit,
            "round": self.round,
            "a": None if self.a is None else self.a.view(),
            "b": None if self.b is None else self.b.view(),
            "same": self.same,
            "firstDivergence": self.first_divergence,
        }


def _sides(calls: Iterable[ModelCall], traces: Iterable[ToolResult]) -> dict[tuple[str, int, int], Side]:
    """Completed model calls (oldest first) by (step, visit, round)."""
    by_call: dict[str, list[ToolResult]] = {}
    for t in traces:
        if t.llm_call_id:
            by_call.setdefault(t.llm_call_id, []).append(t)
    out: dict[tuple[str, int, int], Side] = {}
    seen: dict[tuple[str, int], int] = {}
    for c in calls:
        if c.status != "completed":
            continue
        occurrence = seen.get((c.step_name, c.round), 0) + 1  # a step visited again
        seen[(c.step_name, c.round)] = occurrence
        response = c.response or {}
        tool_calls = [(tc.get("name"), tc.get("arguments")) for tc in response.get("toolCalls") or ()]
        results = [
            t.output_json if t.status == "completed" else {"error": t.error}
            for t in sorted(by_call.get(c.id, []), key=lambda t: t.sequence)
        ]
        out[(c.step_name, occurrence, c.round)] = Side(
            c.model,
            response.get("text"),
            tool_calls,
            results,
            c.input_tokens + c.output_tokens,
            c.cost_usd,
            c.duration_ms,
            c.id,
        )
    return out


Trace = tuple[Iterable[ModelCall], Iterable[ToolResult]]


def align(a: Trace, b: Trace) -> list[Row]:
    """Both runs' model calls aligned by step (and its visit) and round, in A's order then B's
    extra rows; each row says whether the two sides are the same, and the first that is not is
    marked `first_divergence`."""
    left, right = _sides(*a), _sides(*b)
    keys = list(left) + [k for k in right if k not in left]
    rows: list[Row] = []
    diverged = False
    for key in keys:
        sa, sb = left.get(key), right.get(key)
        same = sa is not None and sb is not None and sa.content() == sb.content()
        rows.append(Row(key[0], key[1], key[2], sa, sb, same, not same and not diverged))
        diverged = diverged or not same
    return rows


def diff_rows(a: Trace, b: Trace) -> list[dict[str, Any]]:
    """`align` as JSON (`stevora runs diff --json`)."""
    return [row.view() for row in align(a, b)]
