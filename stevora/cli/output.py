"""`--json` output of the remote commands: the API's own JSON (camelCase), on stdout."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Annotated, Any

import typer
from pydantic import BaseModel
from rich.console import Console

JsonFlag = Annotated[
    bool, typer.Option("--json", help="Print the result as JSON (the API's field names) instead of text.")
]


# Wide enough that no table or line of ours is ever wrapped or cut.
UNWRAPPED_WIDTH = 10_000


def make_console(*, stderr: bool = False) -> Console:
    """A console for the command's text output. On a terminal it fits the terminal's width, and long
    lines (ids, commands to copy) are left whole for the terminal to wrap (`soft_wrap`). When the
    stream is not a terminal (a pipe, a file, a CI log) nothing gives a width and rich would assume
    80 columns, wrapping lines and cutting table cells; there lines and tables are laid out whole
    instead (`COLUMNS`, when set, still wins)."""
    console = Console(stderr=stderr, highlight=False, soft_wrap=True)
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        console.width = UNWRAPPED_WIDTH
    return console


def plain(value: Any) -> Any:
    """Client models (and lists of them) as JSON-ready data with the API's field names."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True)
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def emit(value: Any) -> None:
    """One JSON document on stdout."""
    print(json.dumps(plain(value), indent=2, ensure_ascii=False))


def emit_lines(values: Iterable[Any]) -> None:
    """JSON Lines: one compact document per line, flushed as each arrives (for --follow)."""
    for value in values:
        print(json.dumps(plain(value), ensure_ascii=False, separators=(",", ":")), flush=True)
