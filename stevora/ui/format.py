"""Jinja filters and helpers that turn stored values into readable text.

Durations, costs, token counts and timestamps are formatted here (not in templates) so every
page says the same thing the same way, and so the rules can be unit-tested without a browser.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from markupsafe import Markup, escape

from stevora.clock import iso, utcnow
from stevora.llm.router import provider_name_for_model
from stevora.statuses import TERMINAL_RUN_STATUSES
from stevora.tools.invoke import MAX_ARGUMENT_DEPTH, deeper_than, without_unstorable_chars

# A JSON value longer than this many pretty-printed lines starts collapsed.
COLLAPSE_LINES = 12
_PREVIEW_CHARS = 80


def duration(ms: float | None) -> str:
    """`0.4 ms`, `85 ms`, `1.24 s`, `12.3 s`, `3 min 12 s`, `2 h 05 min`; `—` when unknown."""
    if ms is None:
        return "—"
    if ms < 0.1:
        return "<0.1 ms"
    if ms < 1:
        return f"{ms:.1f} ms"
    if ms < 1000:
        return f"{ms:.0f} ms"
    seconds = ms / 1000
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def span_ms(start: datetime | None, end: datetime | None, *, running: bool = False) -> float | None:
    """Milliseconds from `start` to `end`; to now when `running` and not ended yet."""
    if start is None:
        return None
    if end is None:
        if not running:
            return None
        end = utcnow()
    return max(0.0, (end - start).total_seconds() * 1000)


def run_duration_ms(run: Any) -> float | None:
    end = run["completed_at"] or run["failed_at"] or run["cancelled_at"]
    return span_ms(run["started_at"], end, running=run["status"] not in TERMINAL_RUN_STATUSES)


def step_duration_ms(step: Any) -> float | None:
    return span_ms(step["started_at"], step["completed_at"], running=step["status"] in ("RUNNING", "WAITING"))


def usd(value: float | None) -> str:
    """`$0`, `<$0.0001`, `$0.0123`, `$12.34`."""
    if not value:
        return "$0"
    if value < 0.0001:
        return "<$0.0001"
    if value < 1:
        return f"${value:.4f}"
    return f"${value:,.2f}"


def cents(value: float | None) -> str:
    """Run totals are stored in cents; pages show dollars."""
    return usd((value or 0) / 100)


def tokens(value: int | None) -> str:
    return f"{value or 0:,}"


def relative(dt: datetime | None) -> str:
    """`just now`, `42 s ago`, `5 min ago`, `3 h ago`, `2 d ago` (or `in 5 min` for the future)."""
    if dt is None:
        return "—"
    delta = (utcnow() - dt).total_seconds()
    future = delta < 0
    delta = abs(delta)
    if delta < 5:
        return "just now"
    if delta < 60:
        text = f"{int(delta)} s"
    elif delta < 3600:
        text = f"{int(delta // 60)} min"
    elif delta < 86400:
        text = f"{int(delta // 3600)} h"
    else:
        text = f"{int(delta // 86400)} d"
    return f"in {text}" if future else f"{text} ago"


def absolute(dt: datetime | None) -> str:
    return iso(dt) or ""


def offset(dt: datetime | None, origin: datetime | None) -> str:
    """`+2.27 s`: when something happened relative to the start of its run."""
    if dt is None or origin is None:
        return "—"
    return "+" + duration(max(0.0, (dt - origin).total_seconds() * 1000))


INLINE_JSON_CHARS = 120


def json_inline(value: Any) -> str | None:
    """One-line JSON when it is short enough to read at a glance, else `None`."""
    text = json.dumps(value, ensure_ascii=False, default=str, separators=(", ", ": "))
    return text if len(text) <= INLINE_JSON_CHARS else None


def schema_params(schema: Any) -> list[tuple[str, str, bool]]:
    """`(name, type, required)` for each top-level property of a tool's parameter schema."""
    if not isinstance(schema, dict) or not isinstance(schema.get("properties"), dict):
        return []
    required = set(schema.get("required") or [])
    out = []
    for name, sub in schema["properties"].items():
        kind = sub.get("type", "any") if isinstance(sub, dict) else "any"
        if isinstance(kind, list):
            kind = " | ".join(str(k) for k in kind)
        if isinstance(sub, dict) and isinstance(sub.get("enum"), list):
            kind = " | ".join(json.dumps(v) for v in sub["enum"][:5])
        out.append((str(name), str(kind), name in required))
    return out


@dataclass(frozen=True, slots=True)
class JsonView:
    text: str
    lines: int
    preview: str

    @property
    def long(self) -> bool:
        return self.lines > COLLAPSE_LINES


def _parse_maybe_json(value: Any) -> Any:
    """Tool arguments arrive as the model's raw JSON string; show them as JSON when they parse."""
    if isinstance(value, str):
        stripped = value.strip()
        if stripped[:1] in ("{", "["):
            try:
                parsed = json.loads(stripped)
            except (ValueError, RecursionError):
                return value
            # Nesting a hostile model may send is shown as the string it wrote, not expanded.
            if deeper_than(parsed, MAX_ARGUMENT_DEPTH):
                return value
            return without_unstorable_chars(parsed)  # a page cannot encode a lone surrogate
    return value


def _expand_json_texts(value: Any, depth: int = 0) -> Any:
    """`value` with every string that holds a JSON object or array shown as that JSON (a tool
    result or model answer stored as text would otherwise be one escaped line: `"{\\"a\\": ...}"`)."""
    if depth > MAX_ARGUMENT_DEPTH:
        return value
    if isinstance(value, str):
        parsed = _parse_maybe_json(value)
        return value if parsed is value else _expand_json_texts(parsed, depth + 1)
    if isinstance(value, dict):
        return {k: _expand_json_texts(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand_json_texts(v, depth + 1) for v in value]
    return value


def json_view(value: Any) -> JsonView:
    value = _expand_json_texts(_parse_maybe_json(value))
    if isinstance(value, str):
        text = value
    else:
        text = json.dumps(value, indent=2, ensure_ascii=False, default=str)
    return JsonView(text=text, lines=text.count("\n") + 1, preview=_preview(value))


def _preview(value: Any) -> str:
    if isinstance(value, dict):
        keys = list(value)
        shown = ", ".join(str(k) for k in keys[:6])
        return "{ " + shown + (", …" if len(keys) > 6 else "") + " }"
    if isinstance(value, list):
        return f"[ {len(value)} item{'s' if len(value) != 1 else ''} ]"
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first[:_PREVIEW_CHARS] + ("…" if len(first) > _PREVIEW_CHARS or text.count("\n") else "")


def error_message(error: Any) -> str:
    """The human part of a stored error (`{code, message, details}`, or a bare string)."""
    if isinstance(error, dict):
        return str(error.get("message") or error.get("code") or json.dumps(error, default=str))
    return "" if error is None else str(error)


_CODE_SPAN = re.compile(r"`([^`\n]+)`")


def inline_code(text: Any) -> Markup:
    """A description as written in docstrings and definitions: `backticked` spans become <code>,
    everything else is escaped text."""
    if text is None:
        return Markup("")
    parts = _CODE_SPAN.split(str(text))
    return Markup("").join(
        Markup("<code>{}</code>").format(p) if i % 2 else escape(p) for i, p in enumerate(parts)
    )


FILTERS = {
    "duration": duration,
    "inline_code": inline_code,
    "step_duration_ms": step_duration_ms,
    "usd": usd,
    "cents": cents,
    "tokens": tokens,
    "relative": relative,
    "absolute": absolute,
    "offset": offset,
    "json_inline": json_inline,
    "schema_params": schema_params,
    "json_view": json_view,
    "error_message": error_message,
}


def step_details(step: dict[str, Any]) -> list[tuple[str, str]]:
    """The few fields that say what a definition step does, as `(label, text)` pairs."""
    kind = step.get("type")
    out: list[tuple[str, str]] = []
    if kind == "task":
        out.append(("handler", str(step.get("handler"))))
    elif kind == "wait":
        if step.get("durationMs") is not None:
            out.append(("waits", duration(step["durationMs"])))
        if step.get("untilTimestamp"):
            out.append(("until", str(step["untilTimestamp"])))
    elif kind == "condition":
        out += [
            ("if", str(step.get("expression"))),
            ("then", str(step.get("trueStep"))),
            ("else", str(step.get("falseStep"))),
        ]
    elif kind == "llm":
        models = [step.get("model"), *(step.get("fallbackModels") or [])]
        out.append(("model", " → ".join(str(m) for m in models)))
        if step.get("provider"):
            out.append(("provider", str(step["provider"])))
        else:
            by_name = " → ".join(str(provider_name_for_model(str(m)) or "?") for m in models)
            out.append(("provider", f"{by_name} (by model name; a run shows the provider that answered)"))
        names = [
            t if isinstance(t, str) else t.get("name") or (f"MCP server {t['mcp']}" if "mcp" in t else "?")
            for t in step.get("tools") or []
        ]
        if names:
            out.append(("tools", ", ".join(names)))
            out.append(("max tool rounds", str(step.get("maxToolRounds", 10))))
        if step.get("responseFormat"):
            out.append(("format", str(step["responseFormat"])))
    elif kind == "external_event":
        out.append(("signal", str(step.get("signalType"))))
    elif kind == "approval":
        out.append(("reviews", f"state.{step.get('contentKey')}"))
        if step.get("prompt"):
            out.append(("prompt", str(step["prompt"])))
    if step.get("timeoutMs") is not None and kind in ("external_event", "approval"):
        out.append(("timeout", duration(step["timeoutMs"])))
    retry = step.get("retry")
    if isinstance(retry, dict) and retry.get("maxAttempts") is not None:
        out.append(("attempts", str(retry["maxAttempts"])))
    return out


FILTERS["step_details"] = step_details
