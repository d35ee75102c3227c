"""`stevora runs checkpoints | fork | replay | diff`: time travel from the command line
(docs/time-travel.md)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.markup import escape

from stevora.cli import output
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
            idempotency_key=idempotency_key,
        )
    if as_json:
        output.emit(run)
        return
    console.print(f"forked {run_id} at {escape(at)}: {run['id']}")


@runs_app.command("replay")
def runs_replay(
    run_id: RunId,
    model: Annotated[str | None, typer.Option("--model", help="The model to replay with.")] = None,
    system_prompt: Annotated[str | None, typer.Option("--system-prompt")] = None,
    step: Annotated[str | None, typer.Option("--step", help="The llm step the model applies to.")] = None,
    as_json: JsonFlag = False,
    url: Url = DEFAULT_URL,
    api_key: ApiKey = None,
) -> None:
    """Drive the run again with its tool calls answered from its recorded results (no side effects)."""
    with connect(url, api_key) as rt:
        run = rt.workflows.replay(run_id, model=model, system_prompt=system_prompt, step=step)
    if as_json:
        output.emit(run)
        return
    console.print(f"replaying {run_id}: {run['id']}")


# -- diff ------------------------------------------------------------------------------------


def _brief(side: dict[str, Any] | None) -> str:
    if side is None:
        return "(none)"
    calls = ", ".join(f"{c['name']}({json.dumps(c['arguments'], sort_keys=True)})" for c in side["toolCalls"])
    said = calls or json.dumps(side["text"] or "")
    results = f" → {json.dumps(side['results'])}" if side["results"] else ""
    text = f"{side['model']}: {said}{results}"
    return text if len(text) <= 110 else text[:107] + "..."


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
        console.print(f"  A {escape(_brief(row['a']))}")
        if not row["same"]:
            console.print(f"  B {escape(_brief(row['b']))}")
    if not any(r["firstDivergence"] for r in rows):
        console.print("the runs do not diverge")
