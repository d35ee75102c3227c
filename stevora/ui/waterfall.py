"""The run page's waterfall: steps, model rounds and tool calls as bars on the run's time axis.

Rows come from the stored rows, not the events: a step run has `started_at`/`completed_at`; a model
call and a tool call are committed when they end (`created_at`) with their `duration_ms`, so
they start at `created_at - duration_ms`. A step still running stretches to now. A fork's
inherited rows (copies of its origin's, `inherited_from`) are left out: they ran in the origin, on
its time axis, not in this run.

A `map` step's items (the first the page shows) are drawn under it, each from its child run's start
to its end. Time spent waiting is drawn as "wait" bars, not compute: an `approval`, `external_event` or `wait`
step; a tool call handed to a person, the caller's app or a child run (`awaited_tool_calls`, from
its creation to its answer); and the part of a model call spent waiting for its turn under
`STEVORA_RATE_LIMITS` (`rateLimitWaitMs` of its response), drawn before the call itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from stevora.clock import utcnow
from stevora.round_usage import round_usage
from stevora.statuses import TERMINAL_RUN_STATUSES

if TYPE_CHECKING:
    from stevora.ui.queries import RunView

# A bar is never drawn narrower than this (% of the axis), so an instant tool call stays visible.
MIN_WIDTH_PCT = 0.4


# What a step of these types spends its time on: waiting, not computing.
WAITING_STEP_TYPES = {
    "approval": "waiting for a person",
    "external_event": "waiting for a signal",
    "wait": "timer",
}
AWAITED_BY = {
    "approval": "waiting for a person to approve",
    "client": "waiting for the app",
    "workflow": "waiting for a child run",
}


@dataclass(frozen=True, slots=True)
class Bar:
    kind: str  # "step" | "model" | "compaction" | "tool" | "wait" | "item" (a map step's item)
    label: str
    detail: str
    status: str
    start_ms: float
    duration_ms: float
    left_pct: float
    width_pct: float


@dataclass(frozen=True, slots=True)
class Waterfall:
    bars: list[Bar]
    total_ms: float
    ticks: list[tuple[float, float]]  # (left %, ms)


def _ended(start: datetime, duration_ms: Any) -> tuple[datetime, datetime]:
    return start - timedelta(milliseconds=float(duration_ms or 0)), start


def build(view: RunView, awaited: Sequence[Mapping[str, Any]] = ()) -> Waterfall | None:
    """The bars of a run, or `None` before its first step started. `awaited`: the run's awaited
    tool calls (llm_call_id, tool_name, kind, created_at, answered_at), drawn as waits."""
    run = view.run
    awaited_by_call: dict[str, list[Mapping[str, Any]]] = {}
    for row in awaited:
        awaited_by_call.setdefault(str(row["llm_call_id"]), []).append(row)
    spans: list[tuple[str, str, str, str, datetime, datetime]] = []
    now = utcnow()
    for step in view.steps:
        row = step.row
        if row["started_at"] is None or row["inherited_from"] is not None:
            continue
        end = row["completed_at"] or (now if row["status"] in ("RUNNING", "WAITING") else row["updated_at"])
        attempt = f" · attempt {row['attempt']}" if row["attempt"] > 1 else ""
        waiting = WAITING_STEP_TYPES.get(row["step_type"])
        kind, detail = ("wait", f"{row['step_type']} · {waiting}") if waiting else ("step", row["step_type"])
        spans.append((kind, row["step_name"], detail + attempt, row["status"], row["started_at"], end))
        for item in step.map_items:  # a map step's items, each its child run's span
            if item["started_at"] is not None:
                item_end = item["ended_at"] or now
                status = item["child_status"] or item["status"]
                spans.append(
                    ("item", f"item {item['item_index']}", "child run", status, item["started_at"], item_end)
                )
        for rnd in step.rounds:
            call = rnd.call
            if call["inherited_from"] is not None:
                continue
            start, end = _ended(call["created_at"], call["duration_ms"])
            turn_ms = float((call["response"] or {}).get("rateLimitWaitMs") or 0)
            if turn_ms > 0:  # inside the call's duration, before the request went out
                turn_end = min(end, start + timedelta(milliseconds=turn_ms))
                spans.append(("wait", f"round {call['round']}", "rate limit · waiting for its turn",
                              call["status"], start, turn_end))  # fmt: skip
                start = turn_end
            provider = call["provider"] or "provider ?"
            if provider == "scripted":
                provider = "scripted (offline)"
            ttft = call.get("time_to_first_token_ms")
            first = f" · first token {ttft:.0f} ms" if ttft is not None else ""
            compaction = (call["request"] or {}).get("compaction")
            kind, label = (
                ("compaction", f"compaction {call['round']}")
                if compaction
                else ("model", f"round {call['round']}")
            )
            detail = f"{call['model']} · {provider}{first}"
            if call["status"] == "completed":
                detail += " · " + round_usage(
                    call["input_tokens"], call["cache_read_tokens"], call["output_tokens"]
                )
            if compaction:
                detail += f" · summarised {compaction.get('roundsCompacted')} rounds"
            spans.append((kind, label, detail, call["status"], start, end))
            for wait in awaited_by_call.get(str(call["id"]), []):
                answered = wait["answered_at"] or (
                    now if run["status"] not in TERMINAL_RUN_STATUSES else None
                )
                if answered is not None:
                    who = AWAITED_BY.get(wait["kind"], "waiting")
                    spans.append(("wait", wait["tool_name"], f"round {call['round']} · {who}",
                                  "WAITING" if wait["answered_at"] is None else "completed",
                                  wait["created_at"], answered))  # fmt: skip
            for tc in rnd.tool_calls:
                if tc.trace is None:
                    continue
                start, end = _ended(tc.trace["created_at"], tc.trace["duration_ms"])
                spans.append(("tool", tc.name, f"round {call['round']}", tc.trace["status"], start, end))
    if not spans:
        return None
    origin = run["started_at"] or min(s[4] for s in spans)
    origin = min(origin, *(s[4] for s in spans))
    run_end = run["completed_at"] or run["failed_at"] or run["cancelled_at"]
    if run_end is None or run["status"] not in TERMINAL_RUN_STATUSES:
        run_end = now
    finish = max(run_end, *(s[5] for s in spans))
    total_ms = max((finish - origin).total_seconds() * 1000, 1.0)
    bars = []
    for kind, label, detail, status, start, end in spans:
        start_ms = (start - origin).total_seconds() * 1000
        duration_ms = max(0.0, (end - start).total_seconds() * 1000)
        left = min(100.0, 100 * start_ms / total_ms)
        width = max(MIN_WIDTH_PCT, min(100.0 - left, 100 * duration_ms / total_ms))
        bars.append(Bar(kind, label, detail, status, start_ms, duration_ms, round(left, 2), round(width, 2)))
    ticks = [(100 * i / 4, total_ms * i / 4) for i in range(5)]
    return Waterfall(bars=bars, total_ms=total_ms, ticks=ticks)
