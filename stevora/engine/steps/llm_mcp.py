"""MCP servers as a source of tools for `llm` and `tool` steps (docs/mcp.md).

Resolving: a step's `{"mcp": "files"}` entry offers the server's tools as `files_<tool>`. At the
step's first round the server's list is pinned (`mcp_tool_pins`, with the server's name and version
from initialize); every later round, resume, retry and fork offers exactly the pinned list, and a
replay or fork reads its origin's, so it opens no session just to list. Calling: each call is a
`tools/call` on this process's connection to the server, its idempotency key in `_meta`; what comes
back becomes a `ToolOutcome` like a handler's, so the loop records it (trace + event, one
statement), counts it against the budget and gates it on approval exactly like a handler call.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from stevora.attachments import FILE_MEDIA_TYPES, Attachment, AttachmentError, AttachmentKind
from stevora.db import blobs
from stevora.db import mcp as db_mcp
from stevora.db.database import notify
from stevora.definitions import McpToolsDef
from stevora.errors import StevoraError
from stevora.events import LLM_TEXT_CHANNEL, TOOL_PROGRESS
from stevora.mcp.client import McpConnection, McpUnavailable
from stevora.mcp.config import McpServerConfig
from stevora.mcp.naming import exposed_tool_name
from stevora.mcp.results import Blob, convert_result
from stevora.observability import metrics
from stevora.tools import ToolContext, ToolErrorCode, ToolOutcome, schema_problems

if TYPE_CHECKING:
    from stevora.runtime import Runtime
    from stevora.settings import Settings

log = structlog.get_logger("stevora.mcp")
_EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True, slots=True)
class McpTool:
    """One offered MCP tool: the name the model sees and where calls of it go."""

    name: str
    server: str
    tool: str
    description: str
    parameters: dict[str, Any]
    approve: bool
    server_name: str | None = None
    server_version: str | None = None

    @property
    def requires_approval(self) -> bool:
        """As a registered tool says it (`approve` names it): the awaited kinds' gate reads this."""
        return self.approve


def unknown_server(server: str, where: str) -> StevoraError:
    return StevoraError(
        f"{where} names MCP server '{server}', which no worker's mcpServers file declares and this "
        f"workspace has not registered (POST /v1/mcp-servers)",
        code="MCP_SERVER_UNKNOWN",
        retryable=False,
    )


async def _registered_config(rt: Runtime, workspace_id: str, server: str) -> McpServerConfig | None:
    row = await db_mcp.registered(rt.pool, workspace_id, server)
    if row is None:
        return None
    return McpServerConfig(
        name=server, url=row["url"], headers=dict(row["headers"]), timeoutMs=row["timeout_ms"]
    )


async def connection_for(rt: Runtime, workspace_id: str, server: str) -> McpConnection | None:
    """This process's connection to the worker's own server, else to the workspace's registered one."""
    manager = rt.mcp
    if server in manager.servers:
        return manager.connection(server)
    registered = await _registered_config(rt, workspace_id, server)
    if registered is None:
        return None
    return manager.connection(server, workspace_id=workspace_id, registered=registered)


async def resolve(
    rt: Runtime, *, run_id: str, workspace_id: str, step_name: str, entries: list[McpToolsDef]
) -> list[McpTool]:
    """The MCP tools the step offers, from its pinned lists (pinning them at the first round)."""
    pins: dict[str, Mapping[str, Any]] = dict(await db_mcp.pinned(rt.pool, run_id, step_name))
    offered: list[McpTool] = []
    for entry in entries:
        pin = pins.get(entry.mcp)
        if pin is not None:
            tools, server_name, version = list(pin["tools"]), pin["server_name"], pin["server_version"]
        else:
            tools, server_name, version = await _list_and_pin(rt, run_id, workspace_id, step_name, entry.mcp)
            pins_row = {"tools": tools, "server_name": server_name, "server_version": version}
            pins[entry.mcp] = pins_row  # a second entry for the server reads it
        offered.extend(_offer(entry, tools, server_name, version))
    names: dict[str, McpTool] = {}
    for tool in offered:
        other = names.setdefault(tool.name, tool)
        if other is not tool:
            raise StevoraError(
                f"MCP tools '{other.tool}' and '{tool.tool}' would both be offered as '{tool.name}': "
                f"exclude one, or give the entry a prefix",
                code="MCP_TOOL_NAME_CONFLICT",
                retryable=False,
            )
    return offered


async def _list_and_pin(
    rt: Runtime, run_id: str, workspace_id: str, step_name: str, server: str
) -> tuple[list[dict[str, Any]], str | None, str | None]:
    conn = await connection_for(rt, workspace_id, server)
    if conn is None:
        raise unknown_server(server, f"Step '{step_name}'")
    try:
        listed = await conn.list_tools()
    except McpUnavailable as exc:
        raise StevoraError(str(exc), code="MCP_SERVER_UNAVAILABLE", retryable=True) from exc
    except Exception as exc:  # a protocol error the server answered with: the step may retry
        raise StevoraError(
            f"MCP server '{server}' did not list its tools: {exc}",
            code="MCP_SERVER_UNAVAILABLE",
            retryable=True,
        ) from exc
    tools = [
        {
            "name": t.name,
            "description": (t.description or "")[:1024],
            "inputSchema": t.input_schema if isinstance(t.input_schema, dict) else _EMPTY_SCHEMA,
        }
        for t in listed.tools
    ]
    pinned = await db_mcp.pin(
        rt.pool, run_id, step_name, server, tools, listed.server_name[:200], listed.server_version[:200]
    )
    return pinned, listed.server_name, listed.server_version


def _offer(
    entry: McpToolsDef, tools: list[dict[str, Any]], server_name: str | None, version: str | None
) -> list[McpTool]:
    include = set(entry.include) if entry.include is not None else None
    exclude, approve = set(entry.exclude), set(entry.approve)
    prefix = entry.prefix or entry.mcp
    offered = []
    for tool in tools:
        name = tool.get("name")
        if not isinstance(name, str) or name in exclude or (include is not None and name not in include):
            continue
        schema = tool.get("inputSchema")
        if not isinstance(schema, dict) or schema.get("type") != "object":
            schema = _EMPTY_SCHEMA
        offered.append(
            McpTool(
                name=exposed_tool_name(prefix, name),
                server=entry.mcp,
                tool=name,
                description=str(tool.get("description") or f"{name} (MCP server {entry.mcp})"),
                parameters=schema,
                approve=name in approve,
                server_name=server_name,
                server_version=version,
            )
        )
    return offered


async def call(
    rt: Runtime, tool: McpTool, arguments: dict[str, Any], ctx: ToolContext, *, timeout_ms: int | None = None
) -> ToolOutcome:
    """One MCP tool call as a `ToolOutcome`; never raises except `CancelledError`. The server's
    `timeoutMs` bounds it unless `timeout_ms` is given."""
    started = time.perf_counter()
    labels = (tool.server if tool.server in rt.mcp.servers else "workspace",)

    def failed(code: ToolErrorCode, error: str) -> ToolOutcome:
        # The model reads the error as a handler's: `{"error": ...}` (docs/tool-calling.md).
        metrics.MCP_CALLS.labels(*labels, "failed").inc()
        duration_ms = (time.perf_counter() - started) * 1000
        text = json.dumps({"error": error}, ensure_ascii=False)
        return ToolOutcome("failed", arguments, None, error, code, duration_ms, text)

    problems = schema_problems(tool.parameters, arguments)
    if problems:
        return failed("INVALID_ARGUMENTS", f"Invalid arguments for tool '{tool.name}': {'; '.join(problems)}")
    conn = await connection_for(rt, ctx.workspace_id, tool.server)
    if conn is None:
        return failed("MCP_SERVER_UNAVAILABLE", f"MCP server '{tool.server}' is not known to this worker")
    timeout_s = (timeout_ms if timeout_ms is not None else conn.config.timeout_ms) / 1000

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        await _publish_progress(rt, tool, ctx, progress, total, message)

    try:
        result = await conn.call_tool(
            tool.tool,
            arguments,
            idempotency_key=ctx.idempotency_key,
            timeout_s=timeout_s,
            progress=on_progress,
        )
    except McpUnavailable as exc:
        return failed("MCP_SERVER_UNAVAILABLE", str(exc))
    except TimeoutError:
        return failed("TOOL_TIMEOUT", f"Tool '{tool.name}' timed out after {timeout_s:g}s")
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # the server answered with a protocol error (unknown tool, bad params)
        code: ToolErrorCode = "TOOL_NOT_REGISTERED" if "unknown tool" in str(exc).lower() else "TOOL_ERROR"
        return failed(code, f"MCP server '{tool.server}' refused the call of '{tool.tool}': {exc}")
    finally:
        metrics.MCP_CALL_DURATION.labels(*labels).observe(time.perf_counter() - started)
    converted = convert_result(result)
    if converted.blobs:
        await db_mcp.store_blobs(rt.pool, [(b.sha256, b.mime_type, b.data) for b in converted.blobs])
        # Images and PDFs the model can be sent: its conversation names them by the same hash.
        await blobs.store(rt.pool, ctx.workspace_id, sendable_attachments(converted.blobs, rt.settings))
    if converted.is_error:
        return failed("TOOL_ERROR", converted.error_text)
    output = converted.output
    text = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)
    if len(text.encode("utf-8")) > rt.settings.max_tool_output_bytes:
        return failed(
            "TOOL_OUTPUT_TOO_LARGE",
            f"Tool output is {len(text.encode('utf-8'))} bytes, over the {rt.settings.max_tool_output_bytes}-byte limit",
        )
    metrics.MCP_CALLS.labels(*labels, "completed").inc()
    return ToolOutcome(
        status="completed",
        input=arguments,
        output=output,
        error=None,
        error_code=None,
        duration_ms=(time.perf_counter() - started) * 1000,
        result_text=text,
    )


def sendable_attachments(found: list[Blob], settings: Settings) -> list[Attachment]:
    """The MCP result's binary blocks that pass as images or files (allow-list, magic bytes, size)."""
    out: list[Attachment] = []
    for blob in found:
        kind: AttachmentKind = "file" if blob.mime_type in FILE_MEDIA_TYPES else "image"
        try:
            out.append(
                Attachment.of(kind, blob.mime_type, blob.data, max_bytes=settings.max_attachment_bytes)
            )
        except AttachmentError:
            continue  # kept in mcp_blobs as before; the model reads its block as text only
    return out


async def _publish_progress(
    rt: Runtime, tool: McpTool, ctx: ToolContext, done: float, total: float | None, message: str | None
) -> None:
    # Ephemeral, like a streamed model call's text (stevora.engine.live_text): the live timeline
    # shows it, nothing stores it, and a failed publish never fails the call.
    payload = {
        "event": TOOL_PROGRESS,
        "runId": ctx.workflow_run_id,
        "stepRunId": ctx.step_run_id,
        "round": ctx.round,
        "toolCallId": ctx.tool_call_id[:200],
        "toolName": tool.name,
        "progress": done,
        "total": total,
        "message": (message or "")[:500],
    }
    try:
        await notify(rt.pool, LLM_TEXT_CHANNEL, json.dumps(payload))
    except Exception as exc:
        log.debug("mcp_progress_not_published", error=str(exc))


async def find_tool(
    rt: Runtime, *, run_id: str, workspace_id: str, step_name: str, name: str
) -> McpTool | None:
    """The MCP tool a `tool` step names as `<server>_<tool>` (pinned like an `llm` step's), or None
    when no server of this worker or workspace has that prefix."""
    servers = set(rt.mcp.servers) | {row["name"] for row in await db_mcp.registrations(rt.pool, workspace_id)}
    for server in sorted(servers, key=len, reverse=True):  # the longest prefix that matches
        if name.startswith(f"{server}_"):
            entry = McpToolsDef(mcp=server)
            offered = await resolve(
                rt, run_id=run_id, workspace_id=workspace_id, step_name=step_name, entries=[entry]
            )
            for tool in offered:
                if tool.name == name:
                    return tool
    return None


async def offered_by_run(rt: Runtime, run_id: str, definition_id: str) -> dict[str, McpTool]:
    """Every MCP tool a run's steps offered, by the name the model saw: what its traces came from
    (the API's `source: "mcp"`, `mcpServer`, `mcpTool`; the run page's server and version)."""
    pins = await db_mcp.pins_of_run(rt.pool, run_id)
    if not pins:
        return {}
    spec = await rt.definitions.get(definition_id)
    entries_by_step = {
        step.name: [t for t in getattr(step, "tools", ()) if isinstance(t, McpToolsDef)]
        for step in spec.steps
    }
    found: dict[str, McpTool] = {}
    for pin in pins:
        tools = list(pin["tools"])
        entries = [e for e in entries_by_step.get(pin["step_name"], []) if e.mcp == pin["server"]]
        # A `tool` step names `<server>_<tool>`: the server's own prefix, every tool.
        for entry in entries or [McpToolsDef(mcp=pin["server"])]:
            for tool in _offer(entry, tools, pin["server_name"], pin["server_version"]):
                found.setdefault(tool.name, tool)
    return found
