"""An MCP server of our own (the `mcp` SDK's MCPServer) that logs every call it executes, one JSON
line per call to the file named by `MCP_CALL_LOG`, so tests count what really ran on the server.

Run over stdio (`python -m tests.mcp_servers.counting`) or streamable HTTP
(`python -m tests.mcp_servers.counting --http PORT`). Its tools:
* `echo(text)` — returns the text;
* `add(a, b)` — returns a structured result {"sum": a + b};
* `slow(seconds, steps)` — sleeps, reporting progress `steps` times, then returns "done";
* `fail(message)` — raises, so the result has `isError`;
* `pixel()` — a 1x1 PNG image and a text block;
* `whoami()` — this server process's pid (tests kill it by pid).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
import time
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ImageContent, TextContent

PNG_1X1 = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)

server = MCPServer("counting", version="1.2.3")


def _log(tool: str, arguments: dict[str, Any], ctx: Context | None) -> None:
    path = os.environ.get("MCP_CALL_LOG")
    if not path:
        return
    meta = ctx.request_context.meta if ctx is not None else None
    key = None
    if meta is not None:
        dumped = meta if isinstance(meta, dict) else meta.model_dump(by_alias=True)
        key = dumped.get("idempotencyKey")
    line = {
        "tool": tool,
        "arguments": arguments,
        "idempotencyKey": key,
        "pid": os.getpid(),
        "at": time.time(),
    }
    with open(path, "a", encoding="utf-8") as log:
        log.write(json.dumps(line) + "\n")


@server.tool()
def echo(text: str, ctx: Context) -> str:
    """Return the text unchanged."""
    _log("echo", {"text": text}, ctx)
    return text


@server.tool(structured_output=True)
def add(a: int, b: int, ctx: Context) -> dict[str, int]:
    """Add two integers."""
    _log("add", {"a": a, "b": b}, ctx)
    return {"sum": a + b}


@server.tool()
async def slow(seconds: float, ctx: Context, steps: int = 2) -> str:
    """Sleep for `seconds`, reporting progress along the way."""
    _log("slow", {"seconds": seconds, "steps": steps}, ctx)
    for step in range(steps):
        await ctx.report_progress(step + 1, steps, f"step {step + 1} of {steps}")
        await asyncio.sleep(seconds / max(steps, 1))
    return "done"


@server.tool()
def fail(message: str, ctx: Context) -> str:
    """Always fails with `message`."""
    _log("fail", {"message": message}, ctx)
    raise ToolError(message)


@server.tool()
def pixel(ctx: Context) -> list[TextContent | ImageContent]:
    """A one-pixel PNG."""
    _log("pixel", {}, ctx)
    return [
        TextContent(type="text", text="a pixel"),
        ImageContent(type="image", data=base64.b64encode(PNG_1X1).decode(), mime_type="image/png"),
    ]


@server.tool()
def whoami(ctx: Context) -> int:
    """This server process's pid."""
    _log("whoami", {}, ctx)
    return os.getpid()


def main(argv: list[str]) -> None:
    if len(argv) >= 2 and argv[0] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(argv[1]))
    else:
        server.run("stdio")


if __name__ == "__main__":
    main(sys.argv[1:])
