"""The names a model sees for a server's tools: `<server>_<tool>` (or `<prefix>_<tool>`).

Providers accept tool names of 1-64 characters of `[A-Za-z0-9_-]` (docs/definitions.md), while an
MCP server may name a tool with dots, slashes or 100 characters. Such characters become `_`, and a
name still too long is cut and given a short hash of the original so two long names stay apart.
"""

from __future__ import annotations

import hashlib
import re

MAX_TOOL_NAME = 64
# Short enough that `<server>_<tool>` leaves room for the tool's own name.
MAX_SERVER_NAME = 32
SERVER_NAME_RULE = "1-32 characters of letters, digits, '_' or '-', starting with a letter"
_SERVER_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,31}$")
_NOT_ALLOWED = re.compile(r"[^A-Za-z0-9_-]")


def valid_server_name(name: str) -> bool:
    return bool(_SERVER_NAME.fullmatch(name))


def sanitised(name: str) -> str:
    """`name` with every character a provider's tool name cannot hold replaced by `_`."""
    return _NOT_ALLOWED.sub("_", name) or "_"


def exposed_tool_name(prefix: str, tool: str) -> str:
    """The name the model calls `tool` of a server offered under `prefix` (≤ 64 characters).

    Two tools whose names differ only in replaced characters would meet: the step refuses to
    offer both (`stevora.engine.steps.llm_mcp`), rather than guess which one a call meant."""
    name = f"{prefix}_{sanitised(tool)}"
    if len(name) <= MAX_TOOL_NAME:
        return name
    # Cut: a hash of the whole name keeps two long names that share a beginning apart.
    digest = hashlib.sha256(tool.encode("utf-8")).hexdigest()[:8]
    return f"{name[: MAX_TOOL_NAME - 9]}_{digest}"
