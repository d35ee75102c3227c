"""An MCP server of our own that answers like a hostile one, for the hostile-model suite: results
that are huge, deeply nested, carry NUL and lone surrogates or broken base64, and a call that kills
the server mid-call. Like `counting.py`, it logs every call it executes (one JSON line to the file
`MCP_CALL_LOG` names) before answering, so the suite knows what really ran.

Run over stdio: `python -m tests.mcp_servers.hostile`. Its tools:
* `lookup(order_id)` — text; `sum(a, b)` — structured {"sum": a + b};
* `refund(order_id, amount)` — the suite gates it (`"approve": ["refund"]`);
* `wipe()` — the suite excludes it: it must never run;
* `blob(size)` — `size` characters of text (at most 3 MB);
* `deep(depth)` — structured content nested `depth` levels (at most 3,000);
* `garbage()` — text and structured content carrying NUL (in a value and in a key), which
  PostgreSQL's jsonb cannot hold (a lone surrogate cannot even leave the server: its JSON encoder
  refuses it, so the call is an error result);
* `badimage()` — an image whose base64 is broken, and a text block;
* `die()` — the server process exits during the call.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ImageContent, TextContent

server = MCPServer("hostile", version="6.6.6")


def _log(tool: str, arguments: dict[str, Any], ctx: Context) -> None:
    path = os.environ.get("MCP_CALL_LOG")
    if not path:
        return
    meta = ctx.request_context.meta
    dumped = (meta if isinstance(meta, dict) else meta.model_dump(by_alias=True)) if meta is not None else {}
    line = {"tool": tool, "arguments": arguments, "idempotencyKey": dumped.get("idempotencyKey"),
            "pid": os.getpid(), "at": time.time()}  # fmt: skip
    with open(path, "a", encoding="utf-8") as log:
        log.write(json.dumps(line) + "\n")


@server.tool()
def lookup(order_id: str, ctx: Context) -> str:
    """Look up an order."""
    _log("lookup", {"order_id": order_id}, ctx)
    return f"order {order_id}: 40 EUR"


@server.tool(name="sum", structured_output=True)
def add_up(a: int, b: int, ctx: Context) -> dict[str, int]:
    """Add two integers."""
    _log("sum", {"a": a, "b": b}, ctx)
    return {"sum": a + b}


@server.tool()
def refund(order_id: str, amount: int, ctx: Context) -> str:
    """Refund an order (a person approves each refund)."""
    _log("refund", {"order_id": order_id, "amount": amount}, ctx)
    return "refunded"


@server.tool()
def wipe(ctx: Context) -> str:
    """Never offered: the step excludes it."""
    _log("wipe", {}, ctx)
    return "wiped"


@server.tool()
def blob(size: int, ctx: Context) -> str:
    """A huge text result."""
    _log("blob", {"size": size}, ctx)
    return "x" * max(0, min(size, 3_000_000))


@server.tool(structured_output=True)
def deep(depth: int, ctx: Context) -> dict[str, Any]:
    """A deeply nested structured result."""
    _log("deep", {"depth": depth}, ctx)
    value: Any = "bottom"
    for _ in range(max(0, min(depth, 3000))):
        value = {"a": value}
    return {"a": value}


@server.tool(structured_output=True)
def garbage(ctx: Context) -> dict[str, Any]:
    """NUL in a value and in a key, in text and structured content."""
    _log("garbage", {}, ctx)
    return {"text": "a\x00b", "\x00key": "v\x00", "fine": 1}


@server.tool()
def badimage(ctx: Context) -> list[TextContent | ImageContent]:
    """An image whose base64 does not decode."""
    _log("badimage", {}, ctx)
    return [
        TextContent(type="text", text="an image"),
        ImageContent(type="image", data="!!not base64!!", mime_type="image/png"),
    ]


@server.tool()
def die(ctx: Context) -> str:
    """The server exits during the call (after logging it)."""
    _log("die", {}, ctx)
    os._exit(1)


if __name__ == "__main__":
    server.run("stdio")
