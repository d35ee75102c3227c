"""`stevora prompt`: an ad-hoc agent from the terminal (the `llm --tool` habit).

    stevora prompt "What is our refund policy?" --model gpt-4o --tools myapp.tools [--tool NAME ...]
                   [--max-tool-rounds N] [--system TEXT] [--url URL]

It runs a one-step `llm` run through the engine — an embedded stack by default (embedded
PostgreSQL, in-process worker; the run is kept in `.stevora/` like `stevora dev`'s), or the server
at `--url` / STEVORA_URL — prints each tool call and its result live, then the answer. The run is
stored and viewable like any other (`stevora runs show ID`, the UI).
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import os
import socket
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import MappingProxyType, ModuleType
from typing import Annotated, Any

import typer
from rich.markup import escape

from stevora.cli import app, render
from stevora.cli.remote import ApiKey, connect, console, err
from stevora.client import AgentRuntime, ToolOutput, ValidationFailed
from stevora.tools import OutputLimits, ToolContext, ToolRegistry, invoke_tool

PROMPT_DEFINITION = "stevora-prompt"
CLIENT_TOOL_WAIT_S = 30.0


def prompt_definition(
    model: str,
    tools: list[str | dict[str, Any]],
    max_tool_rounds: int,
    system: str | None,
    history: list[str] | None = None,
) -> dict[str, Any]:
    """The one-step definition a prompt runs; its version is a digest of the settings, so the same
    settings reuse one stored definition and different ones never conflict.

    `tools` are names (registered tools) or inline tool definitions; `history` the roles of an
    earlier exchange's messages, whose text comes from the run input (`input.history`), so a
    conversation of the same shape reuses the definition and its text is never templated."""
    messages = [
        {"role": role, "content": f"{{{{input.history.{i}.content}}}}"}
        for i, role in enumerate(history or [])
    ]
    step: dict[str, Any] = {
        "type": "llm",
        "name": "prompt",
        "model": model,
        "messages": [*messages, {"role": "user", "content": "{{input.prompt}}"}],
        "tools": tools,
        "maxToolRounds": max_tool_rounds,
    }
    if system:
        step["systemPrompt"] = system
    digest = hashlib.sha256(json.dumps(step, sort_keys=True).encode()).hexdigest()[:12]
    return {
        "name": PROMPT_DEFINITION,
        "version": digest,
        "description": "Ad-hoc runs of `stevora prompt`",
        "steps": [step],
    }


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextmanager
def embedded_server(tool_modules: list[str]) -> Iterator[tuple[str, str]]:
    """`(url, api key)` of a private embedded stack (the server extra), stopped on exit."""
    from stevora.devstack import DevStack
    from stevora.settings import Settings

    settings = Settings(log_level=os.environ.get("STEVORA_LOG_LEVEL", "WARNING"))
    settings = settings.model_copy(update={"tool_modules": [*settings.tool_modules, *tool_modules]})
    stack = DevStack(settings, port=_free_port())
    try:
        stack.start_backend()
        stack.start_api_in_thread()
        yield stack.url, stack.api_key
    finally:
        stack.stop()


@dataclass
class Session:
    """What a prompt's run needs from this terminal while it runs."""

    approve_each: bool = False
    # Tools run here, by this process (with --url: the local modules' tools, as client tools).
    local: ToolRegistry | None = None
    asked: set[str] = field(default_factory=set)  # approval requests already answered here


def follow(rt: AgentRuntime, run_id: str, session: Session | None = None) -> None:
    """Print the run's model rounds and each tool call with its arguments and result, live;
    ask about approval-gated calls, and run the calls this terminal executes."""
    session = session or Session()
    progress = render.Progress()
    for event in rt.workflows.stream(run_id):
        kind = event.event_type
        if kind in ("TOOL_CALL_COMPLETED", "TOOL_CALL_FAILED"):
            trace_id = event.payload.get("toolTraceId")
            trace = next((t for t in rt.workflows.tool_traces(run_id) if t.id == trace_id), None)
            if trace is not None:
                result = trace.output_json if trace.status == "completed" else {"error": trace.error}
                console.print(
                    f"    [magenta]⚙[/magenta] {escape(trace.tool_name)}({escape(render.short_json(trace.input_json))})"
                    f" → {escape(render.short_json(result, 400))}"
                )
                continue
        if kind == "APPROVAL_REQUESTED" and _ask_approval(
            rt, event.payload.get("approvalRequestId"), session
        ):
            continue
        if kind == "WORKFLOW_PAUSED" and event.payload.get("reason") == "tool_outputs" and session.local:
            _answer_client_calls(rt, run_id, session)
            continue
        line = progress.line(event)
        if line and kind not in ("STEP_STARTED", "STEP_COMPLETED"):
            console.print(line)


def _ask(name: str, arguments: Any) -> tuple[str, Any]:
    """y / n / e at the terminal: ("approved", None), ("rejected", None) or ("edited", arguments)."""
    console.print(f"    [cyan]?[/cyan] {escape(name)}({escape(render.short_json(arguments, 400))})")
    while True:
        answer = typer.prompt("      run it? [y]es / [n]o / [e]dit", default="y").strip().lower()
        if answer in ("y", "yes"):
            return "approved", None
        if answer in ("n", "no"):
            return "rejected", None
        if answer in ("e", "edit"):
            raw = typer.prompt("      arguments (JSON)", default=json.dumps(arguments, ensure_ascii=False))
            try:
                return "edited", json.loads(raw)
            except ValueError as exc:
                console.print(f"      [red]not JSON[/red]: {escape(str(exc))}")


def _ask_approval(rt: AgentRuntime, approval_id: Any, session: Session) -> bool:
    """Decide a tool call's approval request here (y/n/edit); False when it is not a tool call's."""
    if not isinstance(approval_id, str) or approval_id in session.asked:
        return False
    approval = rt.approvals.get(approval_id)
    content = approval.content if isinstance(approval.content, dict) else {}
    if not approval.pending or "tool" not in content:
        return False
    session.asked.add(approval_id)
    decision, edited = _ask(str(content["tool"]), content.get("arguments"))
    try:
        rt.approvals.decide(approval_id, decision, edited_content=edited, decided_by="stevora prompt")  # type: ignore[arg-type]
    except ValidationFailed as exc:  # an edit that does not fit the schema: ask again
        console.print(f"      [red]{escape(exc.message)}[/red]")
        session.asked.discard(approval_id)
        return _ask_approval(rt, approval_id, session)
    return True


def _answer_client_calls(rt: AgentRuntime, run_id: str, session: Session) -> None:
    """Run the pending calls of this terminal's tools here and send their outputs."""
    assert session.local is not None
    run = rt.workflows.get(run_id)
    if run.required_action is None:
        return
    outputs = []
    for call in run.required_action.tool_calls:
        if session.local.get(call.name) is None:
            continue  # not ours: someone else answers it
        arguments = call.arguments
        if session.approve_each:
            decision, edited = _ask(call.name, arguments)
            if decision == "rejected":
                outputs.append(ToolOutput(call.id, error="The user declined this call"))
                continue
            arguments = edited if decision == "edited" else arguments
        outputs.append(_run_here(session.local, run, call.id, call.name, arguments))
    if outputs:
        rt.workflows.submit_tool_outputs(run_id, outputs)


def _run_here(registry: ToolRegistry, run: Any, call_id: str, name: str, arguments: Any) -> ToolOutput:
    context = ToolContext(
        idempotency_key=f"{run.id}:{call_id}",
        workflow_run_id=run.id,
        workspace_id=run.workspace_id,
        step_run_id=run.step_runs[-1].id if run.step_runs else "",
        step_name="prompt",
        round=0,
        call_index=0,
        tool_call_id=call_id,
        run_input=MappingProxyType(dict(run.input)),
        state=MappingProxyType(dict(run.state)),
    )
    outcome = asyncio.run(
        invoke_tool(
            registry,
            name,
            arguments if isinstance(arguments, dict) else {},
            context=context,
            timeout_s=300.0,
            limits=OutputLimits(max_output_bytes=1_000_000),
        )
    )
    if context.state_updates:
        console.print(
            f"      [yellow]note[/yellow]: {escape(name)}'s state updates are not kept (it ran here)"
        )
    if outcome.ok:
        return ToolOutput(call_id, output=outcome.output)
    return ToolOutput(call_id, error=outcome.error or "the tool failed")


@app.command()
def prompt(
    text: Annotated[str, typer.Argument(help="What to ask the model.")],
    model: Annotated[
        str, typer.Option(help="Model id (routed by prefix; offline runs use `scripted`).")
    ] = "gpt-4o",
    tools: Annotated[
        list[str] | None,
        typer.Option("--tools", help="Module (or .py file) whose register_tool / @tool calls to load."),
    ] = None,
    tool: Annotated[
        list[str] | None,
        typer.Option("--tool", help="Offer this registered tool (default: every tool loaded)."),
    ] = None,
    max_tool_rounds: Annotated[
        int, typer.Option(min=1, max=20, help="Tool rounds before the run fails.")
    ] = 10,
    system: Annotated[str | None, typer.Option(help="System prompt.")] = None,
    approve_each: Annotated[
        bool,
        typer.Option(
            "--approve-each", help="Ask y/n/edit here before each tool call (gated calls always ask)."
        ),
    ] = False,
    continue_: Annotated[
        bool, typer.Option("--continue", "-c", help="Continue the newest prompt exchange.")
    ] = False,
    conversation: Annotated[
        str | None,
        typer.Option("--conversation", help="Continue the exchange of this earlier run (wfrun_...)."),
    ] = None,
    url: Annotated[
        str | None,
        typer.Option("--url", envvar="STEVORA_URL", help="Use this server instead of an embedded stack."),
    ] = None,
    api_key: ApiKey = None,
) -> None:
    """Ask a model, with tools, through the engine; print each tool call and result, then the answer."""
    modules = tools or []
    loaded = _tools_in(modules) if modules else []
    names = list(tool or []) or loaded
    local = _local_registry(loaded) if url else None  # with --url, the local modules' tools run here
    offered = _offered(names, local, approve_each)
    session = Session(approve_each=approve_each, local=local)
    if local is not None:
        err.print(
            f"[dim]{', '.join(n for n in names if n in loaded)}: run here, from {', '.join(modules)} "
            "(the server's tools of these names are not used)[/dim]"
        )
    base = conversation or (_NEWEST if continue_ else None)

    def build(rt: AgentRuntime) -> tuple[dict[str, Any], dict[str, Any]]:
        history = _history(rt, base) if base else []
        spec = prompt_definition(model, offered, max_tool_rounds, system, [m["role"] for m in history])
        return spec, {"prompt": text, **({"history": history} if history else {})}

    if url:
        _run(url, api_key, build, session)
        return
    with embedded_server(modules) as (embedded_url, key):
        _run(embedded_url, key, build, session)


_NEWEST = "newest"


def _local_registry(names: list[str]) -> ToolRegistry | None:
    """The tools this process runs (a copy of the loaded modules' registry), or None without any."""
    from stevora.tools import default_registry

    return default_registry.copy() if names else None


def _offered(names: list[str], local: ToolRegistry | None, approve_each: bool) -> list[str | dict[str, Any]]:
    """The step's tools: client tools for those that run here; gated inline tools for every
    locally known tool with --approve-each (embedded: the worker runs them after the answer);
    else the names (the worker's registered tools)."""
    from stevora.tools import default_registry

    offered: list[str | dict[str, Any]] = []
    for name in names:
        registered = default_registry.get(name)
        if registered is None:
            offered.append(name)
            continue
        declared = {
            "name": name,
            "description": (registered.description or name)[:1024],
            "parameters": dict(registered.parameters),
        }
        if local is not None and local.get(name) is not None:
            offered.append({**declared, "execution": "client"})
        elif approve_each:
            offered.append({**declared, "requiresApproval": True})
        else:
            offered.append(name)
    return offered


def _history(rt: AgentRuntime, base: str) -> list[dict[str, str]]:
    """The whole exchange of an earlier prompt run, as messages: its own history, its question, and
    its answer with the tool calls it made and their results (recorded; nothing runs again)."""
    run = _newest_prompt_run(rt) if base == _NEWEST else rt.workflows.get(base)
    if run.definition is not None and run.definition.name != PROMPT_DEFINITION:
        raise typer.BadParameter(f"{run.id} is not a `stevora prompt` run", param_hint="--conversation")
    lines = []
    for trace in rt.workflows.tool_traces(run.id):
        result = trace.output_json if trace.status == "completed" else {"error": trace.error}
        lines.append(
            f"[called {trace.tool_name}({json.dumps(trace.input_json, ensure_ascii=False)}) → "
            f"{json.dumps(result, ensure_ascii=False)}]"
        )
    answer = (run.state or {}).get("prompt")
    if answer is None:
        answer = f"(no answer: the run {run.status})"
    elif not isinstance(answer, str):
        answer = json.dumps(answer, ensure_ascii=False)
    earlier = [m for m in (run.input or {}).get("history") or [] if isinstance(m, dict)]
    return [
        *earlier,
        {"role": "user", "content": str((run.input or {}).get("prompt", ""))},
        {"role": "assistant", "content": "\n".join([*lines, answer])},
    ]


def _newest_prompt_run(rt: AgentRuntime) -> Any:
    ids = {d.id for d in rt.definitions.list(name=PROMPT_DEFINITION, page_size=100).data}
    for page in range(1, 11):
        found = rt.workflows.list(page=page, page_size=100)
        for run in found.data:
            if run.definition_id in ids:
                return rt.workflows.get(run.id)
        if not found.has_next:
            break
    raise typer.BadParameter("there is no earlier `stevora prompt` run to continue", param_hint="--continue")


def _tools_in(modules: list[str]) -> list[str]:
    """The tools the modules (names or `.py` paths) register; an error that says why when one
    cannot be imported or registers none."""
    from stevora.tools import default_registry
    from workers.edge import load_tool_modules  # the CLI is the process edge that loads tool modules

    found: list[str] = []
    for given in modules:
        before = set(default_registry.names())
        try:
            (name,) = load_tool_modules([given])
        except Exception as exc:  # ModuleNotFoundError, a SyntaxError...: one line, not a traceback
            raise typer.BadParameter(
                f"cannot import tools module {given!r}: {exc}", param_hint="--tools"
            ) from None
        module = sys.modules[name]
        mine = [
            t.name
            for t in default_registry
            if t.name not in before or getattr(t.handler, "__module__", None) == module.__name__
        ]
        if not mine:
            raise typer.BadParameter(_no_tools_reason(given, module), param_hint="--tools")
        found.extend(n for n in mine if n not in found)
    return found


def _no_tools_reason(given: str, module: ModuleType) -> str:
    functions = [
        name
        for name, value in vars(module).items()
        if inspect.isfunction(value) and value.__module__ == module.__name__ and not name.startswith("_")
    ]
    if not functions:
        return f"{given!r} registers no tools: it defines no functions (write them with @tool)"
    return (
        f"{given!r} registers no tools: its functions ({', '.join(functions)}) are not registered — "
        "decorate them with `@tool` (from stevora.tools import tool) or call `register_tool(...)`"
    )


def _run(
    url: str,
    api_key: str | None,
    build: Callable[[AgentRuntime], tuple[dict[str, Any], dict[str, Any]]],
    session: Session,
) -> None:
    with connect(url, api_key) as rt:
        spec, run_input = build(rt)
        definition = rt.definitions.apply(spec)
        run = rt.workflows.create(definition.id, run_input)
        console.print(f"[dim]run {run.id} · {escape(spec['steps'][0]['model'])}[/dim]")
        follow(rt, run.id, session)
        final = rt.workflows.get(run.id)
    if final.status != "COMPLETED":
        console.print(f"{render.status(final.status)}: {escape(render.error_text(final.error))}")
        raise typer.Exit(1)
    answer = (final.state or {}).get("prompt")
    console.print(answer if isinstance(answer, str) else json.dumps(answer, indent=2, ensure_ascii=False))
