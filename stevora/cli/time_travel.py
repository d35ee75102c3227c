"""`stevora runs checkpoints | fork | replay | diff`: time travel from the command line
(docs/time-travel.md)."""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from stevora.cli import output, render
from stevora.cli.output import JsonFlag
from stevora.cli.remote import DEFAULT_URL, ApiKey, Url, connect, console, runs_app
from stevora.engine.run_diff import diff_rows

RunId = Annotated[str, typer.Argument(help="Run id (wfrun_...).")]


def _json_value(text: str, option: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise typer.BadParameter(f"not JSON: {exc}", param_hint=option) from None


def _pairs(items: list[str], option: str) -> dict[str, Any]:
    """`key=JSON` items → {key: value}."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"expected KEY=JSON, got {item!r}", param_hint=option)
        out[key] = _json_value(value, option)
    return out


@runs_app.command("checkpoints")
def runs_checkpoints(
    run_id: RunId, as_json: JsonFlag = False, url: Url = DEFAULT_URL, api_key: ApiKey = None
) -> None:
    """Every point the run can be forked at: before each step, and before each round's model call."""
    with connect(url, api_key) as rt:
        points = rt.workflows.checkpoints(run_id)
    if as_json:
        output.emit(points)
        return
    for p in points:
        calls = ", ".join(p["next"]["toolCallIds"]) or "-"
        keys = ", ".join(sorted(p["state"])) or "-"
        console.print(f"{escape(p['at']):<24} state keys: {escape(keys)}  then tools: {escape(calls)}")


@runs_app.command("fork")
def runs_fork(
    run_id: RunId,
    at: Annotated[str, typer.Option("--at", help="STEP or STEP:ROUND (see `runs checkpoints`).")],
    model: Annotated[str | None, typer.Option("--model", help="Another model for the forked step.")] = None,
    system_prompt: Annotated[
        str | None, typer.Option("--system-prompt", help="Another system prompt for the forked step.")
    ] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="KEY=JSON: a shallow state change (repeatable).")
    ] = None,
    tool_result: Annotated[
        list[str] | None,
        typer.Option(
            "--tool-result", help="CALL_ID=JSON: replace a result of the previous round (repeatable)."
        ),
    ] = None,
    definition_version: Annotated[
        str | None,
        typer.Option("--definition-version", help="Run this version of the definition from the fork point."),
    ] = None,
    idempotency_key: Annotated[str | None, typer.Option("--idempotency-key")] = None,
    as_json: JsonFlag = False,
    url: Url = DEFAULT_URL,
    api_key: ApiKey = None,
) -> None:
    """Fork a run at a checkpoint: a new run inherits everything before it and goes on from there."""
    state = _pairs(set_ or [], "--set")
    results = _pairs(tool_result or [], "--tool-result")
    with connect(url, api_key) as rt:
        run = rt.workflows.fork(
            run_id,
            at,
            state=state,
            tool_results=results,
            model=model,
            system_prompt=system_prompt,
            definition_version=definition_version,
            idempotency_key=idempotency_key,
        )
    if as_json:
        output.emit(run)
        return
    console.print(f"forked {run_id} at {escape(at)}: {run['id']}")


@runs_app.command("replay")
def runs_replay(
    run_ids: Annotated[
        list[str] | None, typer.Argument(help="Run ids to replay (or --definition NAME --last N).")
    ] = None,
    definition: Annotated[
        str | None, typer.Option("--definition", help="Replay the last --last ended runs of this definition.")
    ] = None,
    last: Annotated[int, typer.Option("--last", help="With --definition: how many runs.")] = 10,
    model: Annotated[str | None, typer.Option("--model", help="The model to replay with.")] = None,
    system_prompt: Annotated[str | None, typer.Option("--system-prompt")] = None,
    step: Annotated[str | None, typer.Option("--step", help="The llm step the model applies to.")] = None,
    definition_version: Annotated[
        str | None, typer.Option("--definition-version", help="Replay under this version of the definition.")
    ] = None,
    unmatched: Annotated[
        str | None,
        typer.Option("--unmatched", help="'error' (default): unmatched tool calls fail; 'live': they run."),
    ] = None,
    wait: Annotated[
        float, typer.Option("--wait", help="Seconds to wait for the replays to end (bulk; 0: do not wait).")
    ] = 300.0,
    as_json: JsonFlag = False,
    url: Url = DEFAULT_URL,
    api_key: ApiKey = None,
) -> None:
    """Drive runs again with their tool calls answered from their recorded results (no side
    effects). One RUN: start its replay. Several, or --definition NAME --last N: replay them all,
    wait (up to --wait s) for the replays to end and print each beside its origin."""
    ids = run_ids or []
    if definition is None and not ids:
        raise typer.BadParameter("give run ids or --definition NAME", param_hint="RUN_IDS")
    if definition is not None and ids:
        raise typer.BadParameter("give run ids or --definition, not both", param_hint="--definition")
    options = {
        "model": model,
        "system_prompt": system_prompt,
        "step": step,
        "definition_version": definition_version,
        "unmatched": unmatched,
    }
    with connect(url, api_key) as rt:
        if definition is None and len(ids) == 1:
            run = rt.workflows.replay(ids[0], **options)
            if as_json:
                output.emit(run)
            else:
                console.print(f"replaying {ids[0]}: {run['id']}")
            return
        made = rt.workflows.bulk_replay(
            definition=definition, last=last if definition else None, run_ids=ids or None, **options
        )
        replay_ids = [r["replayId"] for r in made["replays"] if r["replayId"]]
        comparison = _wait_compare(rt, replay_ids, wait) if replay_ids else {"done": True, "runs": []}
    if as_json:
        output.emit({"replays": made["replays"], "comparison": comparison})
        return
    for failed in (r for r in made["replays"] if not r["replayId"]):
        console.print(f"[red]{escape(failed['runId'])}: {escape(failed['error']['message'])}[/red]")
    console.print(comparison_table(comparison))
    if not comparison["done"]:
        console.print(
            f"[yellow]not every replay ended within {wait:g} s: rerun with --wait or see `runs get`[/yellow]"
        )


def _wait_compare(rt: Any, replay_ids: list[str], timeout: float) -> dict[str, Any]:
    """The comparison once every replay has ended, or as it is after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        comparison: dict[str, Any] = rt.workflows.compare_replays(replay_ids)
        if comparison["done"] or time.monotonic() >= deadline:
            return comparison
        time.sleep(min(1.0, max(0.05, deadline - time.monotonic())))


def comparison_table(comparison: dict[str, Any]) -> Table:
    """One row per replay: origin → replay for status, rounds, tokens, cost and latency, the
    replay's matched / unmatched tool calls, and whether the final output is the same."""
    table = Table(title=f"Replays · {len(comparison['runs'])}", box=box.SIMPLE_HEAD)
    for name in ("Run", "Replay", "Status", "Rounds", "Tools m/u", "Tokens", "Cost", "Latency", "Output"):
        table.add_column(name, no_wrap=name != "Output")
    totals = {"origin": [0, 0.0, 0.0], "replay": [0, 0.0, 0.0]}
    for row in comparison["runs"]:
        o, r = row["origin"] or {}, row["replay"]
        for key, side in (("origin", o), ("replay", r)):
            totals[key][0] += side.get("inputTokens", 0) + side.get("outputTokens", 0)
            totals[key][1] += side.get("costUsd", 0.0)
            totals[key][2] += side.get("latencyMs") or 0.0
        tools = r["toolCalls"] or {}
        table.add_row(
            row["runId"],
            row["replayId"],
            f"{render.status(o.get('status', '?'))} → {render.status(r['status'])}",
            f"{o.get('rounds', '?')} → {r['rounds']}",
            f"{tools.get('matched', 0)}/{tools.get('unmatched', 0)}",
            f"{_tokens(o)} → {_tokens(r)}",
            f"{render.usd(o.get('costUsd', 0.0))} → {render.usd(r['costUsd'])}",
            f"{render.duration(o.get('latencyMs'))} → {render.duration(r['latencyMs'])}",
            "same" if row["sameOutput"] else escape(render.short_json(r["output"], 60)),
        )
    (ot, oc, ol), (rt_, rc, rl) = totals["origin"], totals["replay"]
    table.caption = (
        f"total tokens {ot:.0f} → {rt_:.0f} · cost {render.usd(oc)} → {render.usd(rc)} · "
        f"latency {render.duration(ol)} → {render.duration(rl)}"
    )
    return table


def _tokens(side: dict[str, Any]) -> str:
    if not side:
        return "?"
    return str(side["inputTokens"] + side["outputTokens"])


# -- diff ------------------------------------------------------------------------------------


_BRIEF_CHARS = 110
_BRIEF_CONTEXT_CHARS = 30  # shown before the first differing character


def _side_text(side: dict[str, Any] | None) -> str:
    if side is None:
        return "(none)"
    calls = ", ".join(f"{c['name']}({json.dumps(c['arguments'], sort_keys=True)})" for c in side["toolCalls"])
    said = calls or json.dumps(side["text"] or "")
    results = f" → {json.dumps(side['results'])}" if side["results"] else ""
    return f"{side['model']}: {said}{results}"


def _window(text: str, start: int) -> str:
    """`_BRIEF_CHARS` of `text` from `start`, with "..." where something was cut."""
    if len(text) <= _BRIEF_CHARS:
        return text
    start = max(0, min(start, len(text) - _BRIEF_CHARS + 3))
    head = "..." if start > 0 else ""
    room = _BRIEF_CHARS - len(head)
    body = text[start : start + room]
    return head + (body if start + room >= len(text) else body[:-3] + "...")


def brief_pair(a: dict[str, Any] | None, b: dict[str, Any] | None) -> tuple[str, str]:
    """The two sides, each cut to one line around the first character where they differ (a cut
    from the start would hide exactly what differs when two long texts share a beginning)."""
    text_a, text_b = _side_text(a), _side_text(b)
    if text_a == text_b:
        return _window(text_a, 0), _window(text_b, 0)
    first = next(
        (i for i, (x, y) in enumerate(zip(text_a, text_b, strict=False)) if x != y),
        min(len(text_a), len(text_b)),
    )
    start = 0 if first < _BRIEF_CHARS - 10 else first - _BRIEF_CONTEXT_CHARS
    return _window(text_a, start), _window(text_b, start)


@runs_app.command("diff")
def runs_diff(
    run_a: Annotated[str, typer.Argument(help="A run id.")],
    run_b: Annotated[str, typer.Argument(help="Another run id (a fork of A shows best).")],
    as_json: JsonFlag = False,
    url: Url = DEFAULT_URL,
    api_key: ApiKey = None,
) -> None:
    """Two runs side by side, aligned by step and round, with the first point they diverge marked."""
    with connect(url, api_key) as rt:
        a = (rt.workflows.llm_calls(run_a), rt.workflows.tool_traces(run_a))
        b = (rt.workflows.llm_calls(run_b), rt.workflows.tool_traces(run_b))
    rows = diff_rows(a, b)
    if as_json:
        output.emit(rows)
        return
    for row in rows:
        mark = "=" if row["same"] else ("≠ first divergence" if row["firstDivergence"] else "≠")
        visit = f"#{row['visit']}" if row["visit"] > 1 else ""
        console.print(f"[bold]{escape(row['stepName'])}{visit}:{row['round']}[/bold]  {mark}")
        shown_a, shown_b = brief_pair(row["a"], row["b"])
        console.print(f"  A {escape(shown_a)}")
        if not row["same"]:
            console.print(f"  B {escape(shown_b)}")
    if not any(r["firstDivergence"] for r in rows):
        console.print("the runs do not diverge")
