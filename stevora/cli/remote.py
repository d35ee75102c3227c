"""Commands that talk to a running Stevora server over HTTP: keys, definitions, run, runs, approve.

Every command takes `--url` (env STEVORA_URL, default http://127.0.0.1:3000) and `--api-key`
(env STEVORA_API_KEY; without either, the key `stevora dev` wrote to `.stevora/dev-api-key`, or
the file named by STEVORA_API_KEY_FILE). Exit codes: 0 success; 1 an API or connection error,
or a watched run that ended FAILED or CANCELLED; 2 bad usage; 130 when interrupted.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.markup import escape

from stevora.cli import app, output, render
from stevora.cli.output import JsonFlag
from stevora.client import (
    AgentRuntime,
    Conflict,
    StevoraAPIError,
    StevoraConnectionError,
    ToolOutput,
    ValidationFailed,
    WorkflowDefinition,
    WorkflowRun,
)
from stevora.client.operations import Decision

console = output.make_console()
err = output.make_console(stderr=True)

keys_app = typer.Typer(help="Manage API keys.", no_args_is_help=True)
definitions_app = typer.Typer(help="Manage workflow definitions.", no_args_is_help=True)
runs_app = typer.Typer(help="Inspect and act on workflow runs.", no_args_is_help=True)
app.add_typer(keys_app, name="keys")
app.add_typer(definitions_app, name="definitions")
app.add_typer(runs_app, name="runs")

Url = Annotated[str, typer.Option("--url", envvar="STEVORA_URL", help="Server URL.")]
ApiKey = Annotated[
    str | None,
    typer.Option("--api-key", envvar="STEVORA_API_KEY", help="API key (stv_...).", show_default=False),
]
DEFAULT_URL = "http://127.0.0.1:3000"
DEV_KEY_FILE = Path(".stevora") / "dev-api-key"
NO_KEY_HINT = (
    "no API key was given: pass --api-key, set STEVORA_API_KEY, or run `stevora dev` in this folder "
    "(it writes .stevora/dev-api-key, which commands here read)"
)


def default_api_key() -> str | None:
    """The key file of `stevora dev` (STEVORA_API_KEY_FILE, else .stevora/dev-api-key), if any."""
    configured = os.environ.get("STEVORA_API_KEY_FILE")
    path = Path(configured) if configured else DEV_KEY_FILE
    if configured == "" or not path.is_file():
        return None
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


@contextmanager
def connect(url: str, api_key: str | None) -> Iterator[AgentRuntime]:
    """A client for the command; API and connection errors end the command with exit code 1,
    printed as `error CODE (HTTP status): message` (docs/cli.md)."""
    api_key = api_key or default_api_key()
    try:
        with AgentRuntime(api_key, base_url=url) as rt:
            yield rt
    except ValidationFailed as exc:
        err.print(f"[red]error[/red] {exc.code} ({exc.status_code}): {escape(exc.message)}")
        for problem in exc.errors:
            err.print(f"  {escape(problem.get('path') or '(body)')}: {escape(problem.get('message', ''))}")
        raise typer.Exit(1) from None
    except StevoraAPIError as exc:
        err.print(f"[red]error[/red] {exc.code} ({exc.status_code}): {escape(exc.message)}")
        if exc.status_code == 401 and api_key is None:
            err.print(f"  {NO_KEY_HINT}")
        raise typer.Exit(1) from None
    except StevoraConnectionError as exc:
        err.print(
            f"[red]error[/red] CONNECTION_ERROR (no HTTP response): cannot reach the server at "
            f"{escape(url)}: {escape(exc.message)}"
        )
        raise typer.Exit(1) from None


def load_specs(path: Path) -> list[dict[str, Any]]:
    """The definitions in a JSON file (one) or a YAML file (one per `---` document, in order)."""
    try:
        text = path.read_text()
        if path.suffix.lower() == ".json":
            specs = [json.loads(text)]
        else:  # empty documents (a leading or trailing `---`) are skipped
            specs = [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise typer.BadParameter(f"cannot read {path}: {exc}") from None
    if not specs:
        raise typer.BadParameter(f"{path} holds no workflow definition")
    for number, spec in enumerate(specs, 1):
        if not isinstance(spec, dict):
            where = f"document {number} of {path}" if len(specs) > 1 else str(path)
            raise typer.BadParameter(f"{where} must be a workflow definition (an object)")
        if isinstance(spec.get("version"), int | float):  # YAML reads `version: 1.0` as a number
            spec["version"] = str(spec["version"])
    return specs


def apply_order(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The file's definitions, each after the ones of the same file it calls as tools (the server
    checks that a workflow tool names a stored definition); otherwise in file order."""
    names = {spec.get("name") for spec in specs}
    ordered: list[dict[str, Any]] = []
    visiting: set[int] = set()

    def calls(spec: dict[str, Any]) -> list[str]:
        found = []
        for step in spec.get("steps") or []:
            for tool in (step.get("tools") or []) if isinstance(step, dict) else []:
                name = (
                    tool
                    if isinstance(tool, str)
                    else (tool.get("workflow") if isinstance(tool, dict) else None)
                )
                if isinstance(name, str) and name in names and name != spec.get("name"):
                    found.append(name)
        return found

    def visit(spec: dict[str, Any]) -> None:
        if any(spec is done for done in ordered) or id(spec) in visiting:
            return  # placed already, or a cycle (left to the server to report)
        visiting.add(id(spec))
        for name in calls(spec):
            for other in specs:
                if other.get("name") == name:
                    visit(other)
        ordered.append(spec)

    for spec in specs:
        visit(spec)
    return ordered


def apply_file(rt: AgentRuntime, path: Path, *, new_version: bool = False) -> list[WorkflowDefinition]:
    """Apply every definition in the file; returned in file order (the first is the file's main one).

    A definition whose version is stored with other content is a `Conflict`, or with
    `new_version` is stored under the next free version (`1.0.0` → `1.0.1`, `1` → `2`)."""
    specs = load_specs(path)
    applied = {id(spec): _apply_one(rt, spec, new_version) for spec in apply_order(specs)}
    return [applied[id(spec)] for spec in specs]


def _apply_one(rt: AgentRuntime, spec: dict[str, Any], new_version: bool) -> WorkflowDefinition:
    for _ in range(100):
        try:
            return rt.definitions.apply(spec)
        except Conflict:
            if not new_version:
                raise
            spec["version"] = next_version(str(spec.get("version")))
    raise typer.BadParameter(f"no free version found after {spec.get('version')}")


def next_version(version: str) -> str:
    """The version after `version`: its last number plus one, else `.1` appended."""
    found = re.search(r"(\d+)(\D*)$", version)
    if found is None:
        return f"{version}.1"
    return f"{version[: found.start(1)]}{int(found.group(1)) + 1}{found.group(2)}"


def parse_inputs(pairs: list[str], as_json: str | None) -> dict[str, Any]:
    """`--input-json` (an object), then each `--input key=value` (value as JSON when it parses)."""
    values: dict[str, Any] = {}
    if as_json:
        try:
            values = json.loads(as_json)
        except ValueError as exc:
            raise typer.BadParameter(f"--input-json is not JSON: {exc}") from None
        if not isinstance(values, dict):
            raise typer.BadParameter("--input-json must be a JSON object")
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"--input expects key=value, got {pair!r}")
        try:
            values[key] = json.loads(raw)
        except ValueError:
            values[key] = raw
    return values


def resolve_definition(rt: AgentRuntime, target: str, version: str | None) -> WorkflowDefinition:
    """A file is applied; `wfdef_...` is fetched; anything else is a name (newest version)."""
    path = Path(target)
    if path.is_file():  # several definitions (`---`): all are applied, the first one runs
        return apply_file(rt, path)[0]
    if target.startswith("wfdef_"):
        return rt.definitions.get(target)
    return rt.definitions.find(target, version)


def watch(rt: AgentRuntime, run: WorkflowRun, to: Console | None = None) -> WorkflowRun:
    """Print the run's progress live (on `to`, stdout by default) until it ends; returns the
    finished run."""
    out = to or console
    progress = render.Progress()
    try:
        for event in rt.workflows.stream(run.id):
            line = progress.line(event)
            if line:
                out.print(line)
    except KeyboardInterrupt:
        err.print(f"stopped watching; the run continues: stevora runs show {run.id}")
        raise typer.Exit(130) from None
    final = rt.workflows.get(run.id)
    out.print(progress.summary(final))
    return final


@keys_app.command("create")
def keys_create(
    name: Annotated[str, typer.Argument(help="A name to recognise the key by.")],
    workspace_id: Annotated[str | None, typer.Option(help="Workspace for an admin or first key.")] = None,
    admin_token: Annotated[
        str | None,
        typer.Option(envvar="STEVORA_ADMIN_TOKEN", help="The server's ADMIN_TOKEN.", show_default=False),
    ] = None,
    url: Url = DEFAULT_URL,
    api_key: ApiKey = None,
) -> None:
    """Create an API key and print it (it is shown only this once)."""
    with connect(url, api_key) as rt:
        created = rt.api_keys.create(name, workspace_id=workspace_id, admin_token=admin_token)
    err.print(f"Created API key {created.id} '{escape(created.name)}' in workspace {created.workspace_id}.")
    err.print("Store it now; it cannot be shown again:")
    print(created.key)


@definitions_app.command("apply")
def definitions_apply(
    file: Annotated[
        Path,
        typer.Argument(
            help="Definition as JSON or YAML (several YAML documents separated by `---`).",
            exists=True,
            dir_okay=False,
        ),
    ],
    new_version: Annotated[
        bool,
        typer.Option(
            "--new-version",
            help="A definition stored under the file's version with other content is stored "
            "under the next free version instead of failing with CONFLICT.",
        ),
    ] = False,
    url: Url = DEFAULT_URL,
    api_key: ApiKey = None,
) -> None:
    """Create the definitions in a file (unchanged re-applies are no-ops); prints each id."""
    with connect(url, api_key) as rt:
        definitions = apply_file(rt, file, new_version=new_version)
    for definition in definitions:
        err.print(f"{escape(definition.name)} v{escape(definition.version)}:")
        print(definition.id)


@app.command("run")
def run_command(
    target: Annotated[str, typer.Argument(help="Definition file, definition id, or definition name.")],
    input: Annotated[list[str] | None, typer.Option("--input", "-i", help="key=value (repeatable).")] = None,
    input_json: Annotated[str | None, typer.Option(help="The whole input as a JSON object.")] = None,
    version: Annotated[str | None, typer.Option(help="With a name: this version (default newest).")] = None,
    idempotency_key: Annotated[str | None, typer.Option(help="Reuse the run created with this key.")] = None,
    watch_run: Annotated[
        bool, typer.Option("--watch", "-w", help="Follow the run live until it ends.")
    ] = False,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json", help="Print the run as JSON (the API's field names); with --watch, once it has ended."
        ),
    ] = False,
    url: Url = DEFAULT_URL,
    api_key: ApiKey = None,
) -> None:
    """Start a workflow run (and with --watch, follow it; exit 1 if it fails)."""
    inputs = parse_inputs(input or [], input_json)
    with connect(url, api_key) as rt:
        definition = resolve_definition(rt, target, version)
        run = rt.workflows.create(definition.id, inputs, idempotency_key=idempotency_key)
        reused = "" if run.created is not False else " (existing run for this idempotency key)"
        line = (f"Run [bold]{run.id}[/bold] of {escape(definition.name)} v{escape(definition.version)}"
                f" {render.status(run.status)}{reused}")  # fmt: skip
        # With --json, stdout holds only the JSON document; the progress lines go to stderr.
        (err if as_json else console).print(line)
        if not watch_run:
            if as_json:
                output.emit(run)
            return
        final = watch(rt, run, err if as_json else console)
    if as_json:
        output.emit(final)
    if final.status != "COMPLETED":
        raise typer.Exit(1)


@runs_app.command("list")
def runs_list(
    status: Annotated[str | None, typer.Option(help="Only runs in this status.")] = None,
    definition_id: Annotated[str | None, typer.Option(help="Only runs of this definition.")] = None,
    definition: Annotated[
        str | None, typer.Option("--definition", help="Only runs of this workflow name (any version).")
    ] = None,
    page: Annotated[int, typer.Option(min=1, help="Page number.")] = 1,
    page_size: Annotated[int, typer.Option(min=1, max=100, help="Runs per page.")] = 20,
    as_json: JsonFlag = False,
    url: Url = DEFAULT_URL,
    api_key: ApiKey = None,
) -> None:
    """List runs, newest first."""
    with connect(url, api_key) as rt:
        found = rt.workflows.list(
            page=page,
            page_size=page_size,
            status=status.upper() if status else None,
            definition_id=definition_id,
            definition_name=definition,
        )
    if as_json:
        output.emit({"data": output.plain(found.data), "meta": output.plain(found.meta)})
        return
    console.print(render.runs_table(found))


@runs_app.command("show")
def runs_show(
    run_id: Annotated[str, typer.Argument(help="Run id (wfrun_...).")],
    as_json: JsonFlag = False,
    url: Url = DEFAULT_URL,
    api_key: ApiKey = None,
) -> None:
    """Show a run and its steps."""
    with connect(url, api_key) as rt:
        run = rt.workflows.get(run_id)
    if as_json:
        output.emit(run)
        return
    console.print(render.run_header(run))
    console.print(render.steps_table(run))
    with connect(url, api_key) as rt:
        calls = rt.workflows.llm_calls(run_id)
    for line in render.round_lines(calls):  # per model call: input, cached, context; compactions
        console.print(line)
    pending = render.pending_tool_calls(run)
    if pending is not None:
        console.print(pending)
    if run.status == "WAITING":
        with connect(url, api_key) as rt:
            approvals = [
                a for a in rt.approvals.list(pending=True, limit=1000) if a.workflow_run_id == run.id
            ]
        for approval in approvals:
            console.print(render.approval_hint(approval))


runs_app.command("get", help="Show a run and its steps (same as `show`).")(runs_show)


@runs_app.command("events")
def runs_events(
    run_id: Annotated[str, typer.Argument(help="Run id (wfrun_...).")],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new events until the run ends.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="JSON: an array; with --follow, one event per line (JSON Lines).")
    ] = False,
    url: Url = DEFAULT_URL,
    api_key: ApiKey = None,
) -> None:
    """Print a run's events, oldest first."""
    with connect(url, api_key) as rt:
        events = rt.workflows.stream(run_id) if follow else rt.workflows.iter_events(run_id)
        try:
            if not as_json:
                for event in events:
                    console.print(render.event_line(event))
            elif follow:
                output.emit_lines(events)
            else:
                output.emit(list(events))
        except KeyboardInterrupt:
            raise typer.Exit(130) from None


@app.command("approve")
def approve(
    approval_id: Annotated[
        str, typer.Argument(help="Approval id (apr_...), or a run id waiting for approval.")
    ],
    reject: Annotated[
        bool, typer.Option("--reject", help="Reject instead of approving (the run fails).")
    ] = False,
    edit: Annotated[
        str | None, typer.Option("--edit", help="Approve with this content instead (JSON, else text).")
    ] = None,
    by: Annotated[str | None, typer.Option("--by", help="Who decided (recorded).")] = None,
    as_json: JsonFlag = False,
    url: Url = DEFAULT_URL,
    api_key: ApiKey = None,
) -> None:
    """Decide a pending approval; the run continues."""
    if reject and edit is not None:
        raise typer.BadParameter("use either --reject or --edit")
    edited: Any = None
    if edit is not None:
        try:
            edited = json.loads(edit)
        except ValueError:
            edited = edit
    decision: Decision = "rejected" if reject else "edited" if edit is not None else "approved"
    with connect(url, api_key) as rt:
        if approval_id.startswith("wfrun_"):
            pending = [a for a in rt.approvals.list(pending=True) if a.workflow_run_id == approval_id]
            if not pending:
                err.print(f"[red]error[/red] run {approval_id} has no pending approval")
                raise typer.Exit(1)
            approval_id = pending[0].id
        decided = rt.approvals.decide(approval_id, decision, edited_content=edited, decided_by=by)
    if as_json:
        output.emit(decided)
        return
    console.print(
        f"{decision} {decided.id} ({escape(decided.step_name)}); run {decided.workflow_run_id} continues"
    )


def parse_tool_outputs(outputs: list[str], errors: list[str]) -> list[ToolOutput]:
    """`--output CALL_ID=JSON` (a value that is not JSON is sent as a string) and
    `--error CALL_ID=MESSAGE`, in the order given."""
    items: list[ToolOutput] = []
    for option, pairs in (("--output", outputs), ("--error", errors)):
        for pair in pairs:
            call_id, sep, raw = pair.partition("=")
            if not sep or not call_id:
                raise typer.BadParameter(f"{option} expects CALL_ID=VALUE, got {pair!r}")
            if option == "--error":
                items.append(ToolOutput(call_id, error=raw or "error"))
                continue
            try:
                value: Any = json.loads(raw)
            except ValueError:
                value = raw
            items.append(ToolOutput(call_id, output=value))
    if not items:
        raise typer.BadParameter("give at least one --output CALL_ID=JSON or --error CALL_ID=MESSAGE")
    return items


@runs_app.command("tool-outputs")
def runs_tool_outputs(
    run_id: Annotated[str, typer.Argument(help="Run id (wfrun_...) waiting for tool outputs.")],
    outputs: Annotated[
        list[str] | None,
        typer.Option("--output", "-o", help="CALL_ID=JSON: a call's result (not JSON: sent as a string)."),
    ] = None,
    errors: Annotated[
        list[str] | None, typer.Option("--error", "-e", help="CALL_ID=MESSAGE: the call failed.")
    ] = None,
    as_json: JsonFlag = False,
    url: Url = DEFAULT_URL,
    api_key: ApiKey = None,
) -> None:
    """Answer client-executed tool calls of a waiting run; it resumes when none is pending."""
    items = parse_tool_outputs(outputs or [], errors or [])
    with connect(url, api_key) as rt:
        run = rt.workflows.submit_tool_outputs(run_id, items)
    if as_json:
        output.emit(run)
        return
    answered = ", ".join(i.tool_call_id for i in items)
    console.print(f"Answered {escape(answered)}; run {run.id} {render.status(run.status)}")
    pending = render.pending_tool_calls(run)
    if pending is not None:
        console.print(pending)
    if run.status == "WAITING":
        with connect(url, api_key) as rt:
            approvals = [
                a for a in rt.approvals.list(pending=True, limit=1000) if a.workflow_run_id == run.id
            ]
        for approval in approvals:
            console.print(render.approval_hint(approval))
