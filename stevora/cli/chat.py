"""`stevora chat DEFINITION`: a conversation with an agent in the terminal (docs/threads.md).

Each line is a message to a thread of the definition (a turn: a traced run). The turn's tool calls
and live text are shown while it works, then its answer. `/fork` continues in a new thread from
here (the old one stays as it is), `/history` prints the conversation, `/quit` (or end of input)
leaves; `--thread` picks up an existing thread and prints its history first.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.markup import escape

from stevora.cli import app, render
from stevora.cli.remote import DEFAULT_URL, ApiKey, Url, connect, console, err
from stevora.client import AgentRuntime
from stevora.client.threads import TextDelta, ThreadMessage

OnActive = Annotated[
    str,
    typer.Option(
        "--on-active",
        help="What a message does while a turn is still working: reject, enqueue, interrupt, steer.",
    ),
]


@app.command()
def chat(
    definition: Annotated[str, typer.Argument(help="An agent definition: its name (newest version) or id.")],
    thread: Annotated[str | None, typer.Option("--thread", help="Continue this thread (thr_...).")] = None,
    on_active: OnActive = "reject",
    url: Url = DEFAULT_URL,
    api_key: ApiKey = None,
) -> None:
    """Talk to an agent: each line is a turn of a thread; /fork, /history, /quit."""
    if on_active not in ("reject", "enqueue", "interrupt", "steer"):
        raise typer.BadParameter("one of reject, enqueue, interrupt, steer", param_hint="--on-active")
    with connect(url, api_key) as rt:
        if thread:
            current = rt.threads.get(thread)
            _history(rt.threads.messages(current.id))
        elif definition.startswith("wfdef_"):
            current = rt.threads.create(definition, on_active=on_active)  # type: ignore[arg-type]
        else:
            current = rt.threads.create(definition_name=definition, on_active=on_active)  # type: ignore[arg-type]
        err.print(f"[dim]thread {current.id} · /fork, /history, /quit[/dim]")
        last: str | None = None  # the stream's last event id: each turn's stream starts after it
        while True:
            try:
                line = input("> ").strip()
            except EOFError:
                break
            if not line:
                continue
            if line in ("/quit", "/exit"):
                break
            if line == "/history":
                _history(rt.threads.messages(current.id))
                continue
            if line == "/fork":
                current, last = rt.threads.fork(current.id), None
                err.print(f"[dim]forked: thread {current.id} continues from here[/dim]")
                continue
            last = _turn(rt, current.id, line, last)


def _turn(rt: AgentRuntime, thread_id: str, text: str, last: str | None) -> str | None:
    """Send `text`, show the turn as it works and its answer; returns the stream's last event id."""
    sent = rt.threads.send(thread_id, text)
    if sent.policy != "start":
        err.print(f"[dim]{sent.policy}: run {sent.run_id}[/dim]")
        if sent.policy in ("enqueue", "steer"):
            return last
    streamed = False
    for item in rt.threads.stream(thread_id, last, until_run_ends=sent.run_id, text=True):
        if isinstance(item, TextDelta):
            if item.run_id == sent.run_id:
                console.print(item.text, end="", soft_wrap=True, markup=False, highlight=False)
                streamed = True
            continue
        last = f"{item.workflow_run_id}:{item.sequence}"
        if item.workflow_run_id != sent.run_id:
            continue
        if item.event_type == "TOOL_CALL_COMPLETED" or item.event_type == "TOOL_CALL_FAILED":
            name = item.payload.get("toolName", "?")
            mark = "✓" if item.event_type == "TOOL_CALL_COMPLETED" else "✗"
            err.print(f"[dim]  {mark} {escape(str(name))}[/dim]")
    if streamed:
        console.print()
    run = rt.workflows.get(sent.run_id)
    if run.status != "COMPLETED":
        console.print(f"{render.status(run.status)}: {escape(render.error_text(run.error))}")
        return last
    if not streamed:
        answers = [
            m for m in rt.threads.messages(thread_id) if m.run_id == sent.run_id and m.role == "assistant"
        ]
        final = next((m for m in reversed(answers) if m.content), None)
        console.print(_text(final.content) if final else "(no answer)", markup=False, highlight=False)
    return last


def _history(messages: list[ThreadMessage]) -> None:
    for m in messages:
        if m.role == "user":
            console.print(f"[bold]> {escape(_text(m.content))}[/bold]")
        elif m.role == "assistant" and m.tool_calls:
            names = ", ".join(str(c.get("name")) for c in m.tool_calls)
            err.print(f"[dim]  called {escape(names)}[/dim]")
        elif m.role == "assistant":
            console.print(_text(m.content), markup=False, highlight=False)


def _text(content: Any) -> str:
    return content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
