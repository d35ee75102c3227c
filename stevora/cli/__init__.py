"""The `stevora` command.

Process commands (`dev`, `demo`, `api`, `worker`, `migrate`) live in `server.py`; commands that talk
to a running server over HTTP (`keys`, `definitions`, `run`, `runs`, `approve`) in `remote.py`.
The remote commands need only the client install (`pip install stevora`); the process commands
need the `server` extra.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

import typer

app = typer.Typer(
    name="stevora",
    help="Durable workflows with traced, checkpointed LLM tool-calling steps.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

SERVER_COMMANDS = ("migrate", "api", "worker", "dev", "demo")


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"stevora {version('stevora')}")
        except PackageNotFoundError:  # running from a source tree that was never installed
            from stevora import __version__

            typer.echo(f"stevora {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    show_version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Durable workflows with traced, checkpointed LLM tool-calling steps."""


def _server_stub(name: str, missing: str) -> Callable[[], None]:
    def stub() -> None:
        typer.echo(
            f"error: `stevora {name}` needs the server install (missing module '{missing}'): "
            "pip install 'stevora[server]'",
            err=True,
        )
        raise typer.Exit(2)

    return stub


SERVER_INSTALL_HINT = "Needs the server install: pip install 'stevora[server]'."


def _register_server_stubs(missing: str, into: typer.Typer | None = None) -> None:
    """Without the server extra, the process commands say what to install instead of vanishing."""
    from rich.markup import escape

    for name in SERVER_COMMANDS:
        (into or app).command(
            name,
            # Help text is rich markup: unescaped, `[server]` would read as a style tag and vanish.
            help=escape(SERVER_INSTALL_HINT),
            context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
        )(_server_stub(name, missing))


def main() -> None:
    from stevora.cli import chat, prompt, remote, run_commands, time_travel, trigger_commands  # noqa: F401  (they register their commands on `app`)

    try:
        from stevora.cli import server  # noqa: F401
    except ModuleNotFoundError as exc:
        _register_server_stubs(exc.name or "?")
    from stevora.cli import mcp_commands  # noqa: F401  (`stevora mcp`; `serve` needs the server extra)

    app()
