"""`stevora runs cancel | retry | pause | resume | signal | budget` and `runs llm-calls | traces`.

The commands call the same API routes as the client (`/v1/workflow-runs/{id}/cancel`, ...); the
reads print a table, or with `--json` the API's JSON.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any

import typer
from rich.markup import escape

from stevora.cli import app, output, render
from stevora.cli.output import JsonFlag
from stevora.cli.remote import DEFAULT_URL, ApiKey, Url, connect, console, runs_app
from stevora.client import WorkflowRun

RunId = Annotated[str, typer.Argument(help="Run id (wfrun_...).")]
StepName = Annotated[str | None, typer.Option("--step", help="Only this step's calls.")]


def _done(verb: str, run: WorkflowRun, as_json: bool) -> None:
    if as_json:
        output.emit(run)
    else:
        console.print(f"{verb} {run.id}: {render.status(run.status)}")


# name: (what it prints, help). Each calls the client method of the same name.
SIMPLE_COMMANDS = {
    "cancel": (
        "cancelled",
        "Cancel a run that has not finished; its open steps and approvals are cancelled.",
    ),
    "pause": (
        "paused",
        "Pause a RUNNING run; the worker stops at its next checkpoint (`runs resume` continues).",
    ),
    "resume": ("resumed", "Un-pause a PAUSED run."),
}


def _simple_command(name: str, verb: str) -> Callable[..., None]:
    def command(
        run_id: RunId, as_json: JsonFlag = False, url: Url = DEFAULT_URL, api_key: ApiKey = None
    ) -> None:
        with connect(url, api_key) as rt:
            _done(verb, getattr(rt.workflows, name)(run_id), as_json)

    return command


for _name, (_verb, _help) in SIMPLE_COMMANDS.items():
    runs_app.command(_name, help=_help)(_simple_command(_name, _verb))


@runs_app.command("retry")
def runs_retry(
    run_ids: Annotated[list[str] | None, typer.Argument(help="Run ids (wfrun_...) to retry.")] = None,
    failed: Annotated[
        bool, typer.Option("--failed", help="Every FAILED run of --definition (in --since/--until).")
    ] = False,
    definition: Annotated[str | None, typer.Option("--definition", help="With --failed: its runs.")] = None,
    since: Annotated[str | None, typer.Option("--since", help="Failed at or after (ISO 8601).")] = None,
    until: Annotated[str | None, typer.Option("--until", help="Failed before (ISO 8601).")] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only count the runs a bulk retry takes.")
    ] = False,
    as_json: JsonFlag = False,
    url: Url = DEFAULT_URL,
    api_key: ApiKey = None,
) -> None:
    """Run a FAILED run's failed step again, with a fresh attempt budget. With --failed (or several
    ids): every FAILED run of --definition that failed in the window, one by one, each reported
    (one run's failure does not stop the others); --dry-run counts them first."""
    ids = run_ids or []
    if not failed and not ids:
        raise typer.BadParameter("give run ids, or --failed --definition NAME", param_hint="RUN_IDS")
    if failed and definition is None and not ids:
        raise typer.BadParameter("--failed needs --definition (or run ids)", param_hint="--definition")
    with connect(url, api_key) as rt:
        if not failed and len(ids) == 1 and not dry_run:
            _done("retrying", rt.workflows.retry(ids[0]), as_json)
            return
        result = rt.workflows.retry_failed(
            definition=definition, run_ids=ids or None, since=since, until=until, dry_run=dry_run
        )
    if as_json:
        output.emit(result)
        return
    more = " (more left: run again)" if result["truncated"] else ""
    if dry_run:
        console.print(f"{result['count']} FAILED run(s) would be retried{more}")
        for run_id in result["runIds"]:
            console.print(f"  {run_id}")
        return
    for row in result["results"]:
        if row["outcome"] == "RETRIED":
            console.print(f"  {row['runId']}: retrying")
        else:
            console.print(f"  [red]{row['runId']}: {escape(render.error_text(row['error']))}[/red]")
    console.print(f"retried {result['retried']} of {result['count']} FAILED run(s){more}")


def _payload(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise typer.BadParameter(f"not JSON: {exc}", param_hint="--payload") from None
    if not isinstance(value, dict):
        raise typer.BadParameter("must be a JSON object", param_hint="--payload")
    return value


@runs_app.command("signal")
def runs_signal(
    run_id: RunId,
    signal_type: Annotated[str, typer.Argument(help="The signal the run's external_event step waits for.")],
    payload: Annotated[
        str | None, typer.Option("--payload", "-p", help="A JSON object merged into the run's state.")
    ] = None,
    as_json: JsonFlag = False,
    url: Url = DEFAULT_URL,
    api_key: ApiKey = None,
) -> None:
    """Send the signal a run waits for in an `external_event` step; the run continues."""
    body = _payload(payload)
    with connect(url, api_key) as rt:
        _done(f"sent '{escape(signal_type)}' to", rt.workflows.resume(run_id, signal_type, body), as_json)


@runs_app.command("budget")
def runs_budget(
    run_id: RunId,
    max_cost_cents: Annotated[
        float | None,
        typer.Option("--max-cost-cents", min=0, help="The run's model spend limit, in US cents."),
    ] = None,
    max_model_calls: Annotated[
        int | None, typer.Option("--max-model-calls", min=0, help="Model calls the run may make.")
    ] = None,
    max_tool_calls: Annotated[
        int | None, typer.Option("--max-tool-calls", min=0, help="Tool calls the run may make.")
    ] = None,
    on_exceeded: Annotated[
        str | None,
        typer.Option("--on-exceeded", help="What a reached limit does: `fail` or `pause`."),
    ] = None,
    as_json: JsonFlag = False,
    url: Url = DEFAULT_URL,
    api_key: ApiKey = None,
) -> None:
    """Change a run's budget (the limits given; the others stay). A run waiting for its budget
    resumes; without options, print the budget and what the run has used of it."""
    if on_exceeded is not None and on_exceeded not in ("fail", "pause"):
        raise typer.BadParameter("must be 'fail' or 'pause'", param_hint="--on-exceeded")
    changes = (max_cost_cents, max_model_calls, max_tool_calls, on_exceeded)
    with connect(url, api_key) as rt:
        if all(value is None for value in changes):
            run = rt.workflows.get(run_id)
        else:
            run = rt.workflows.set_budget(
                run_id,
                max_cost_cents=max_cost_cents,
                max_model_calls=max_model_calls,
                max_tool_calls=max_tool_calls,
                on_budget_exceeded=on_exceeded,
            )
    if as_json:
        output.emit(run)
        return
    console.print(f"{run.id}: {render.status(run.status)}")
    for line in render.budget_lines(run):
        console.print(line)


def _show(items: list[Any], as_json: bool, lines: Callable[[Any], list[str]]) -> None:
    if as_json:
        output.emit(items)
        return
    for line in lines(items):
        console.print(line)


@runs_app.command("llm-calls")
def runs_llm_calls(
    run_id: RunId,
    step: StepName = None,
    as_json: JsonFlag = False,
    url: Url = DEFAULT_URL,
    api_key: ApiKey = None,
) -> None:
    """The run's model calls, oldest first: round, model and provider, tokens, cost, latency."""
    with connect(url, api_key) as rt:
        _show(rt.workflows.llm_calls(run_id, step_name=step), as_json, render.llm_call_lines)


@runs_app.command("traces")
def runs_traces(
    run_id: RunId,
    step: StepName = None,
    as_json: JsonFlag = False,
    url: Url = DEFAULT_URL,
    api_key: ApiKey = None,
) -> None:
    """The run's tool calls in execution order: arguments, result or error, duration."""
    with connect(url, api_key) as rt:
        _show(rt.workflows.tool_traces(run_id, step_name=step), as_json, render.trace_lines)


@app.command("rate-limits")
def rate_limits(as_json: JsonFlag = False, url: Url = DEFAULT_URL, api_key: ApiKey = None) -> None:
    """The provider rate limits shared by every worker, and what each has in use in its window."""
    with connect(url, api_key) as rt:
        _show(rt.rate_limits(), as_json, render.rate_limit_lines)
