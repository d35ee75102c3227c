"""`--json` output of the remote commands: the API's own JSON (camelCase), on stdout."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Annotated, Any

import typer
from pydantic import BaseModel

JsonFlag = Annotated[
    bool, typer.Option("--json", help="Print the result as JSON (the API's field names) instead of text.")
]


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
