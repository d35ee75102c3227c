"""The `stevora` command.

Process commands (`dev`, `demo`, `api`, `worker`, `migrate`) live in `server.py`; commands that talk
to a running server over HTTP (`keys`, `definitions`, `run`, `runs`, `approve`) in `remote.py`.
"""

from __future__ import annotations

import typer

app = typer.Typer(
    name="stevora",
    help="Durable workflows with traced, checkpointed LLM tool-calling steps.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def main() -> None:
    from stevora.cli import remote, server  # noqa: F401  (they register their commands on `app`)

    app()
