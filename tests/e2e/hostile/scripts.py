"""What a hostile model says, generated with hypothesis: a script of turns per run.

A turn is a round of tool calls (names drawn from the offered tools, tools registered in the
worker but not offered, look-alikes of offered names, empty and random names; arguments valid,
wrong-typed, deeply nested, non-JSON, carrying NUL or lone surrogates; ids that collide within a
round and across rounds), optionally with text, or an HTTP error (429 with a retry-after, 500, 503,
a dropped connection). At most one call per run carries a megabyte argument and at most one turn
is a burst of a hundred or more calls, so one example stays within a few seconds.
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass
from typing import Any, Literal

from hypothesis import strategies as st

from stevora.testing.fake_llm import (
    FakeResponse,
    anthropic_text,
    anthropic_tool_use,
    disconnect,
    error,
    openai_text,
    openai_tool_calls,
)

Wire = Literal["openai", "anthropic"]

# The step offers these (globalTools: false). `issue_refund` needs a person's approval.
OFFERED = ("get_order", "add_numbers", "issue_refund")
GATED = "issue_refund"
# Registered in the worker, never offered by the step: a plain tool, a global tool (the step has
# globalTools: false) and an approval-gated tool.
UNOFFERED = ("delete_account", "current_time", "wire_money")
# The step also offers an MCP server's tools (tests/mcp_servers/hostile.py, as server `h`, with
# `exclude: ["wipe"]` and `approve: ["refund"]`): results huge, deeply nested, carrying NUL and lone
# surrogates or broken base64, and `h_die`, which kills the server mid-call.
MCP_SERVER = "h"
MCP_OFFERED = tuple(
    f"h_{t}" for t in ("lookup", "sum", "refund", "blob", "deep", "garbage", "badimage", "die")
)
MCP_GATED = "h_refund"
MCP_UNOFFERED = ("h_wipe", "wipe", "lookup", "h__lookup", "mcp.h.lookup", "h_missing")
DECISIONS = ("approved", "rejected", "edited")
MODEL = {"openai": "gpt-4o-mini", "anthropic": "claude-haiku-4-5"}


@dataclass(frozen=True)
class Raw:
    """OpenAI `arguments` sent as this exact string (the Anthropic wire carries objects only)."""

    text: str


@dataclass(frozen=True)
class Call:
    id: str
    name: str
    args: Any  # a JSON value, or Raw

    def openai(self) -> tuple[str, str, str]:
        if isinstance(self.args, Raw):
            return (self.id, self.name, self.args.text)
        return (self.id, self.name, json.dumps(self.args))

    def anthropic(self) -> tuple[str, str, dict[str, Any]]:
        args = self.args
        if isinstance(args, Raw):
            args = {"raw": args.text}
        elif not isinstance(args, dict):
            args = {"value": args}
        return (self.id, self.name, args)


@dataclass(frozen=True)
class Turn:
    calls: tuple[Call, ...] = ()
    text: str | None = None
    error: str | None = None  # "429", "500", "503", "disconnect"

    def render(self, wire: Wire) -> FakeResponse:
        if self.error == "disconnect":
            return disconnect()
        if self.error is not None:
            status = int(self.error)
            return error(status, "hostile fake says no", retry_after_ms=5 if status == 429 else None)
        if not self.calls:
            return openai_text(self.text or "") if wire == "openai" else anthropic_text(self.text or "")
        if wire == "openai":
            return openai_tool_calls([c.openai() for c in self.calls], text=self.text)
        return anthropic_tool_use([c.anthropic() for c in self.calls], text=self.text)


@dataclass(frozen=True, repr=False)
class Script:
    wire: Wire
    max_tool_rounds: int
    sdk_retries: int
    turns: tuple[Turn, ...]
    decisions: tuple[str, ...]  # for the approval requests, in order (cycled)
    budget: dict[str, int] | None = None  # the run's maxModelCalls / maxToolCalls (onBudgetExceeded: fail)

    @property
    def calls(self) -> int:
        return sum(len(t.calls) for t in self.turns)

    def __repr__(self) -> str:
        return f"<Script {self.describe()}>"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))  # hypothesis would print every field, megabytes deep

    def describe(self) -> str:
        """A short account for hypothesis' falsifying-example note (the values can be megabytes)."""
        parts = []
        for t in self.turns:
            if t.error:
                parts.append(f"err{t.error}")
            else:
                names = ",".join(repr(c.name)[:30] for c in t.calls[:6]) + ("..." if len(t.calls) > 6 else "")
                parts.append(f"[{len(t.calls)}: {names}]" + (" +text" if t.text else ""))
        return (
            f"{self.wire} maxToolRounds={self.max_tool_rounds} sdkRetries={self.sdk_retries} budget={self.budget} "
            + " ".join(parts)
        )


# --- names ---------------------------------------------------------------------------------


def _look_alikes(name: str) -> list[str]:
    return [
        name.upper(),
        name[:1].upper() + name[1:],
        f" {name}",
        f"{name} ",
        f"{name}\n",
        f"{name}\t",
        name.replace("o", "\u043e"),  # Cyrillic o
        name.replace("e", "\u0435"),  # Cyrillic e
        name.replace("_", "\u200b_"),  # zero-width space
        name + "\u0661",  # Arabic-Indic digit one
        "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in name),  # full-width
        f"functions.{name}",
        f"{name}()",
        name.replace("_", "-"),
        f"{name}_v2",
        f"{name}\x00",
        name * 8,  # longer than the trace's 64-character column
    ]


LOOK_ALIKES = tuple(sorted({n for name in OFFERED for n in _look_alikes(name)} - set(OFFERED)))
MCP_LOOK_ALIKES = tuple(
    sorted({n for name in ("h_lookup", "h_refund") for n in _look_alikes(name)} - set(MCP_OFFERED))
)

names = st.one_of(
    st.sampled_from(OFFERED),
    st.just(GATED),  # so that approvals are asked for, and decided, in most runs
    st.sampled_from(OFFERED),
    st.sampled_from(UNOFFERED),
    st.sampled_from(LOOK_ALIKES),
    st.sampled_from(MCP_OFFERED),
    st.just(MCP_GATED),
    st.sampled_from(MCP_UNOFFERED + MCP_LOOK_ALIKES),
    st.sampled_from(["", " ", "\x00", "null", "None", "*", "../get_order"]),
    st.text(max_size=20),
    st.text(alphabet=string.ascii_lowercase + "_", min_size=65, max_size=300),
)

# --- ids -----------------------------------------------------------------------------------

_ID_ALPHABET = string.ascii_letters + string.digits + "_-"
ids = st.one_of(
    st.sampled_from(["call_1", "call_2", "toolu_1", "dup"]),  # collide within and across rounds
    st.text(alphabet=_ID_ALPHABET, min_size=1, max_size=24),
    st.sampled_from(["", " ", "call 1", "call_\u00e9", "x" * 41, "y" * 65, "z" * 250]),
)

# --- arguments -----------------------------------------------------------------------------

_nasty_text = st.sampled_from(["", "\x00", "a\x00b", "\ud800", "\udfff x", "\u202e", "\ufeff", "😀" * 3])
_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
    _nasty_text,
)
json_values = st.recursive(
    _leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def _deep(depth: int, kind: str) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = [value] if kind == "list" else {"a": value}
    return value


def _deep_raw(depth: int, kind: str) -> Raw:
    """Nesting too deep for Python's json module (and orjson), written out as the string it is."""
    if kind == "list":
        return Raw("[" * depth + "]" * depth)
    return Raw('{"order_id": ' + '{"a": ' * depth + "1" + "}" * depth + "}")


# As objects (both wires; the fake and the SDKs encode them with the json module, whose recursion
# ends near 1000 levels) and as strings on the OpenAI wire, where nothing parses them but Stevora.
deep_values = st.builds(_deep, st.integers(min_value=20, max_value=600), st.sampled_from(["list", "dict"]))
deep_raw = st.builds(_deep_raw, st.integers(min_value=200, max_value=5000), st.sampled_from(["list", "dict"]))

valid_args = st.one_of(
    st.fixed_dictionaries({"order_id": st.text(max_size=12)}),
    st.fixed_dictionaries({"a": st.integers(-1000, 1000), "b": st.integers(-1000, 1000)}),
    st.fixed_dictionaries({"order_id": st.text(max_size=12), "amount": st.integers(0, 10_000)}),
)
wrong_args = st.one_of(
    st.fixed_dictionaries({"order_id": json_values}),
    st.fixed_dictionaries({"a": json_values, "b": json_values}),
    st.fixed_dictionaries({"order_id": json_values, "amount": json_values}),
    st.fixed_dictionaries({"order_id": st.text(max_size=8)}, optional={"extra": json_values}),
    json_values,
)
raw_args = st.one_of(
    st.sampled_from(
        [
            "",
            "   ",
            "{",
            "null",
            "[1, 2]",
            '"get_order"',
            '{"order_id": NaN}',
            '{"a": Infinity, "b": -Infinity}',
            '{"a": 1e999, "b": 1}',
            '{"amount": 123456789012345678901234567890, "order_id": "o"}',
            '{"order_id": "\\u0000"}',
            '{"order_id": "\\ud800"}',
            '{"order_id": "o", "order_id": 5}',
            '{"a": 1, "b": 2}{"a": 3}',
        ]
    ),
    st.text(max_size=40).map(Raw),
).map(lambda v: v if isinstance(v, Raw) else Raw(v))
small_args = st.one_of(valid_args, valid_args, wrong_args, raw_args)
args = st.one_of(small_args, small_args, deep_values.map(lambda v: {"order_id": v}), deep_values, deep_raw)


def _huge(size: int, where: str) -> Any:
    blob = "x" * size
    if where == "string":
        return {"order_id": blob}
    if where == "key":
        return {blob: 1}
    return {"order_id": "o", "items": [blob[:1000]] * (size // 1000)}


huge_args = st.builds(
    _huge, st.integers(min_value=100_000, max_value=1_200_000), st.sampled_from(["string", "key", "list"])
)

_valid_for: dict[str, st.SearchStrategy[Any]] = {
    "get_order": st.fixed_dictionaries({"order_id": st.text(max_size=12)}),
    "add_numbers": st.fixed_dictionaries({"a": st.integers(-1000, 1000), "b": st.integers(-1000, 1000)}),
    "issue_refund": st.fixed_dictionaries(
        {"order_id": st.text(max_size=12), "amount": st.integers(0, 10_000)}
    ),
    "h_lookup": st.fixed_dictionaries({"order_id": st.text(max_size=12)}),
    "h_sum": st.fixed_dictionaries({"a": st.integers(-1000, 1000), "b": st.integers(-1000, 1000)}),
    "h_refund": st.fixed_dictionaries({"order_id": st.text(max_size=12), "amount": st.integers(0, 10_000)}),
    "h_blob": st.fixed_dictionaries({"size": st.sampled_from([0, 10, 70_000, 600_000, 3_000_000])}),
    "h_deep": st.fixed_dictionaries({"depth": st.sampled_from([1, 50, 400, 3000])}),
    "h_garbage": st.just({}),
    "h_badimage": st.just({}),
    "h_die": st.just({}),
}


# The MCP-heavy form (its own test): mostly the server's tools, with valid arguments more often,
# so each hostile result (huge, deep, garbage, broken image, a dying server) is met in CI.
mcp_names = st.one_of(
    st.sampled_from(MCP_OFFERED),
    st.sampled_from(MCP_OFFERED),
    st.sampled_from(("h_die", "h_garbage", "h_deep", "h_blob", "h_badimage")),
    st.just(MCP_GATED),
    st.sampled_from(MCP_UNOFFERED + MCP_LOOK_ALIKES),
    st.sampled_from(OFFERED),
)


@st.composite
def calls(draw: st.DrawFn, pool: st.SearchStrategy[str] = names) -> Call:
    """A call; an offered name gets arguments valid for it half the time (so calls run and approvals
    are asked for), anything from `args` otherwise."""
    name = draw(pool)
    valid = _valid_for.get(name)
    arguments = draw(valid) if valid is not None and draw(st.booleans()) else draw(args)
    return Call(draw(ids), name, arguments)


texts = st.one_of(st.none(), st.text(max_size=40), _nasty_text)


def _burst(count: int, name_pool: list[str], arg: Any, text: str | None) -> Turn:
    return Turn(
        calls=tuple(Call(f"call_{i % 7}", name_pool[i % len(name_pool)], arg) for i in range(count)),
        text=text,
    )


bursts = st.builds(
    _burst,
    st.integers(min_value=100, max_value=300),
    st.lists(names, min_size=1, max_size=5),
    valid_args,
    texts,
)
errors = st.sampled_from(["429", "429", "500", "503", "disconnect"])
turns = st.one_of(
    st.builds(Turn, st.lists(calls(), min_size=1, max_size=6).map(tuple), texts),
    st.builds(Turn, st.lists(calls(), min_size=1, max_size=6).map(tuple), texts),
    st.builds(Turn, st.lists(calls(), min_size=1, max_size=6).map(tuple), texts),
    st.builds(Turn, error=errors),
)


mcp_turns = st.one_of(
    st.builds(Turn, st.lists(calls(mcp_names), min_size=1, max_size=4).map(tuple), texts),
    st.builds(Turn, st.lists(calls(mcp_names), min_size=1, max_size=4).map(tuple), texts),
    st.builds(Turn, error=errors),
)


@st.composite
def scripts(draw: st.DrawFn, turn_pool: st.SearchStrategy[Turn] = turns) -> Script:
    wire: Wire = draw(st.sampled_from(["openai", "anthropic"]))
    body = list(draw(st.lists(turn_pool, min_size=1, max_size=7)))
    if draw(st.integers(0, 3)) == 0:  # a burst of a hundred calls or more, somewhere
        body.insert(draw(st.integers(0, len(body))), draw(bursts))
    if draw(st.integers(0, 3)) == 0:  # one megabyte argument in one call
        at = draw(st.sampled_from([i for i, t in enumerate(body) if t.calls] or [None]))
        if at is not None:
            turn = body[at]
            huge = Call(draw(ids), draw(names), draw(huge_args))
            body[at] = Turn(calls=(*turn.calls, huge), text=turn.text)
    if draw(st.booleans()):
        body.append(Turn(text=draw(st.text(max_size=40))))  # a final answer
    return Script(
        wire=wire,
        max_tool_rounds=draw(st.integers(1, 6)),
        sdk_retries=draw(st.integers(0, 1)),
        turns=tuple(body),
        decisions=tuple(
            draw(st.lists(st.sampled_from(["approved", "rejected", "edited"]), min_size=1, max_size=4))
        ),
        budget=draw(
            st.none()
            | st.fixed_dictionaries({"maxModelCalls": st.integers(0, 8), "maxToolCalls": st.integers(0, 40)})
        ),
    )
