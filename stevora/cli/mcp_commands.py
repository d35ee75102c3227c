"""`stevora mcp`: the MCP servers a deployment knows (`list`), and Stevora as an MCP server
(`serve`: workflow definitions as tools for Claude Desktop, an IDE or another agent). docs/mcp.md."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import httpx
import typer
from rich.markup import escape
from rich.table import Table

from stevora.cli import app, output
from stevora.cli.output import JsonFlag
from stevora.cli.remote import DEFAULT_URL, NO_KEY_HINT, ApiKey, Url, default_api_key

mcp_app = typer.Typer(help="MCP servers: list them, or serve workflows as MCP tools.", no_args_is_help=True)
app.add_typer(mcp_app, name="mcp")
console = output.make_console()
err = output.make_console(stderr=True)


def _key(api_key: str | None) -> str:
    key = api_key or default_api_key()
    if key is None:
        err.print(f"[red]error[/red] {NO_KEY_HINT}")
        raise typer.Exit(1)
    return key


@mcp_app.command("list")
def list_servers(url: Url = DEFAULT_URL, api_key: ApiKey = None, as_json: JsonFlag = False) -> None:
    """The workers' own MCP servers (with their health) and this workspace's registered ones."""
    try:
        response = httpx.get(
            f"{url.rstrip('/')}/v1/mcp-servers", headers={"x-api-key": _key(api_key)}, timeout=30
        )
    except httpx.HTTPError as exc:
        err.print(
            f"[red]error[/red] CONNECTION_ERROR (no HTTP response): cannot reach the server at {escape(url)}: {exc}"
        )
        raise typer.Exit(1) from None
    body: dict[str, Any] = response.json()
    if not response.is_success:
        error = body.get("error", {})
        err.print(
            f"[red]error[/red] {error.get('code')} ({response.status_code}): {escape(str(error.get('message')))}"
        )
        raise typer.Exit(1)
    data = body["data"]
    if as_json:
        output.emit(data)
        return
    table = Table("server", "where", "transport", "state", "restarts", "version / url", "last error")
    for row in data["workers"]:
        table.add_row(
            row["name"],
            f"worker {row['workerId']}",
            row["transport"],
            row["state"],
            str(row["restarts"]),
            row.get("serverVersion") or "",
            escape(row.get("lastError") or ""),
        )
    for row in data["registered"]:
        table.add_row(row["name"], "workspace", "http", "", "", escape(row["url"]), "")
    console.print(table)


@mcp_app.command("serve")
def serve(
    definitions: Annotated[
        str,
        typer.Option("--definitions", help="Definition names, comma-separated: each becomes one MCP tool."),
    ],
    transport: Annotated[str, typer.Option(help="stdio (default) or http (streamable HTTP)")] = "stdio",
    host: Annotated[str, typer.Option(help="HTTP bind address")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="HTTP port")] = 8765,
    url: Url = DEFAULT_URL,
    api_key: ApiKey = None,
) -> None:
    """Serve workflow definitions as MCP tools: a call starts a durable run and returns its output."""
    from stevora.cli.mcp_serve import build_server, load_tools, run_stdio, serve_http
    from stevora.client import AsyncAgentRuntime, NotFound

    names = [name.strip() for name in definitions.split(",") if name.strip()]
    if not names:
        err.print("[red]error[/red] --definitions: give at least one definition name")
        raise typer.Exit(2)
    if transport not in ("stdio", "http"):
        err.print("[red]error[/red] --transport: stdio or http")
        raise typer.Exit(2)
    client = AsyncAgentRuntime(_key(api_key), base_url=url)
    try:
        tools = asyncio.run(load_tools(client, names))
    except NotFound as exc:
        err.print(f"[red]error[/red] --definitions: {escape(exc.message)}")
        raise typer.Exit(1) from None
    # A fresh client for the server's own event loop (the one above belongs to a finished loop).
    client = AsyncAgentRuntime(_key(api_key), base_url=url)
    server = build_server(client, tools)
    if transport == "stdio":
        run_stdio(server)
    else:
        err.print(f"serving {len(tools)} tool(s) at http://{host}:{port}/mcp")
        serve_http(server, host, port)
