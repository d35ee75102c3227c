"""`stevora prompt`: an ad-hoc agent from the terminal (the `llm --tool` habit).

    stevora prompt "What is our refund policy?" --model gpt-4o --tools myapp.tools [--tool NAME ...]
                   [--max-tool-rounds N] [--system TEXT] [--url URL]

It runs a one-step `llm` run through the engine — an embedded stack by default (embedded
PostgreSQL, in-process worker; the run is kept in `.stevora/` like `stevora dev`'s), or the server
at `--url` / STEVORA_URL — prints each tool call and its result live, then the answer. The run is
stored and viewable like any other (`stevora runs show ID`, the UI).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer
from rich.markup import escape

from stevora.cli import app, render
from stevora.cli.remote import ApiKey, connect, console
from stevora.client import AgentRuntime

PROMPT_DEFINITION = "stevora-prompt"


def prompt_definition(
    model: str, tools: list[str], max_tool_rounds: int, system: str | None
) -> dict[str, Any]:
    """The one-step definition a prompt runs; its version is a digest of the settings, so the same
    settings reuse one stored definition and different ones never conflict."""
    step: dict[str, Any] = {
        "type": "llm",
        "name": "prompt",
        "model": model,
        "messages": [{"role": "user", "content": "{{input.prompt}}"}],
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


def follow(rt: AgentRuntime, run_id: str) -> None:
    """Print the run's model rounds and each tool call with its arguments and result, live."""
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
        line = progress.line(event)
        if line and kind not in ("STEP_STARTED", "STEP_COMPLETED"):
            console.print(line)


@app.command()
def prompt(
    text: Annotated[str, typer.Argument(help="What to ask the model.")],
    model: Annotated[
        str, typer.Option(help="Model id (routed by prefix; offline runs use `scripted`).")
    ] = "gpt-4o",
    tools: Annotated[
        list[str] | None, typer.Option("--tools", help="Module whose register_tool / @tool calls to load.")
    ] = None,
    tool: Annotated[
        list[str] | None,
        typer.Option("--tool", help="Offer this registered tool (default: every tool loaded)."),
    ] = None,
    max_tool_rounds: Annotated[
        int, typer.Option(min=1, max=20, help="Tool rounds before the run fails.")
    ] = 10,
    system: Annotated[str | None, typer.Option(help="System prompt.")] = None,
    url: Annotated[
        str | None,
        typer.Option("--url", envvar="STEVORA_URL", help="Use this server instead of an embedded stack."),
    ] = None,
    api_key: ApiKey = None,
) -> None:
    """Ask a model, with tools, through the engine; print each tool call and result, then the answer."""
    modules = tools or []
    names = list(tool or [])
    if not names and modules:
        names = _tools_in(modules)
    spec = prompt_definition(model, names, max_tool_rounds, system)
    if url:
        _run(url, api_key, spec, text)
        return
    with embedded_server(modules) as (embedded_url, key):
        _run(embedded_url, key, spec, text)


def _tools_in(modules: list[str]) -> list[str]:
    from stevora.tools import default_registry
    from workers.edge import load_tool_modules  # the CLI is the process edge that loads tool modules

    before = set(default_registry.names())
    load_tool_modules(modules)
    return [name for name in default_registry.names() if name not in before] or default_registry.names()


def _run(url: str, api_key: str | None, spec: dict[str, Any], text: str) -> None:
    with connect(url, api_key) as rt:
        definition = rt.definitions.apply(spec)
        run = rt.workflows.create(definition.id, {"prompt": text})
        console.print(f"[dim]run {run.id} · {escape(spec['steps'][0]['model'])}[/dim]")
        follow(rt, run.id)
        final = rt.workflows.get(run.id)
    if final.status != "COMPLETED":
        console.print(f"{render.status(final.status)}: {escape(render.error_text(final.error))}")
        raise typer.Exit(1)
    answer = (final.state or {}).get("prompt")
    console.print(answer if isinstance(answer, str) else json.dumps(answer, indent=2, ensure_ascii=False))
