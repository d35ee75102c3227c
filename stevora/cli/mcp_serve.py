"""`stevora mcp serve`: Stevora's workflow definitions as the tools of an MCP server (docs/mcp.md).

Each definition named with `--definitions` is one tool: its name is the definition's name with every
character a tool name cannot hold replaced by `_`, its input schema the definition's `inputSchema`
(else the one its `defaultParams` describe). A call starts a durable run through the API (the same
client as the other commands), reports the run's progress as MCP progress notifications while it
runs, and returns its output (`structuredContent` and its JSON as text). A failed run is an
`isError` result; a run that waits for a person's approval or for client tool outputs says so and
returns (the run goes on in Stevora; its id is in the result). Built on the `mcp` SDK's low-level
server, so the tool list is the definitions', not Python signatures'.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import anyio
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp_types import (
    CallToolRequestParams,
    CallToolResult,
    ListToolsResult,
    PaginatedRequestParams,
    TextContent,
    Tool,
)

from stevora import __version__
from stevora.client import AsyncAgentRuntime
from stevora.client.models import WorkflowRun
from stevora.definitions.params import ParamsError, parse_default_params
from stevora.mcp.naming import MAX_TOOL_NAME, sanitised

ENDED = ("COMPLETED", "FAILED", "CANCELLED")
POLL_S = 0.25
_ANY_INPUT: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": True}


@dataclass(frozen=True)
class DefinitionTool:
    name: str
    definition_id: str
    definition_name: str
    version: str
    description: str
    input_schema: dict[str, Any]
    step_names: tuple[str, ...]


def tool_name(definition_name: str) -> str:
    return sanitised(definition_name)[:MAX_TOOL_NAME]


def input_schema(extra: dict[str, Any]) -> dict[str, Any]:
    """The definition's `inputSchema`, else the schema its `defaultParams` describe, else any object."""
    schema = extra.get("inputSchema")
    if isinstance(schema, dict) and schema.get("type") == "object":
        return schema
    params = extra.get("defaultParams")
    if params:
        try:
            return parse_default_params(params)
        except ParamsError:
            pass
    return dict(_ANY_INPUT)


async def load_tools(client: AsyncAgentRuntime, names: list[str]) -> dict[str, DefinitionTool]:
    """The newest version of each named definition as a tool (raises the client's NotFound)."""
    tools: dict[str, DefinitionTool] = {}
    for name in names:
        found = await client.definitions.find(name)
        extra = found.model_extra or {}
        tool = DefinitionTool(
            name=tool_name(found.name),
            definition_id=found.id,
            definition_name=found.name,
            version=found.version,
            description=found.description
            or f"Run the Stevora workflow '{found.name}' (version {found.version})",
            input_schema=input_schema(extra),
            step_names=tuple(str(step.get("name")) for step in found.steps),
        )
        tools[tool.name] = tool
    return tools


def build_server(
    client: AsyncAgentRuntime, tools: dict[str, DefinitionTool], *, poll_s: float = POLL_S
) -> Server[Any]:
    async def list_tools(
        ctx: ServerRequestContext[Any], params: PaginatedRequestParams | None
    ) -> ListToolsResult:
        return ListToolsResult(
            tools=[
                Tool(name=t.name, description=t.description, input_schema=t.input_schema)
                for t in tools.values()
            ]
        )

    async def call_tool(ctx: ServerRequestContext[Any], params: CallToolRequestParams) -> CallToolResult:
        tool = tools.get(params.name)
        if tool is None:
            return _error(f"Unknown tool '{params.name}' (offered: {', '.join(sorted(tools)) or 'none'})")
        run = await client.workflows.create(tool.definition_id, params.arguments or {})
        last_step: str | None = None
        while run.status not in ENDED and not await _waits_for_someone(client, run):
            if run.current_step_name != last_step and run.current_step_name is not None:
                last_step = run.current_step_name
                done = tool.step_names.index(last_step) if last_step in tool.step_names else 0
                await ctx.session.report_progress(
                    done, len(tool.step_names) or None, f"run {run.id}: step '{last_step}'"
                )
            # Short polls, not the API's long poll (which answers only once the run settles): each
            # step the run enters is a progress notification.
            await anyio.sleep(poll_s)
            run = await client.workflows.get(run.id)
        return _result(run)

    server: Server[Any] = Server(
        "stevora", version=__version__, on_list_tools=list_tools, on_call_tool=call_tool
    )
    return server


async def _waits_for_someone(client: AsyncAgentRuntime, run: WorkflowRun) -> bool:
    """A run that cannot go on by itself: paused, or waiting for client tool outputs or for an
    approval (a timer, a child run or a rate limit it waits for ends by itself: keep polling)."""
    if run.status == "PAUSED" or run.required_action is not None:
        return True
    if run.status != "WAITING":
        return False
    pending = await client.approvals.list(pending=True, limit=100)
    return any(a.workflow_run_id == run.id for a in pending)


def _result(run: WorkflowRun) -> CallToolResult:
    if run.status == "COMPLETED":
        output = run.output or {}
        return CallToolResult(
            content=[TextContent(type="text", text=json.dumps(output, ensure_ascii=False))],
            structured_content={"runId": run.id, "status": run.status, "output": output},
        )
    if run.status in ("FAILED", "CANCELLED"):
        error = run.error or {}
        return _error(
            f"Run {run.id} {run.status.lower()}: {error.get('code', '')} {error.get('message', '')}".strip(),
            {"runId": run.id, "status": run.status, "error": error},
        )
    if run.required_action is not None:
        what = "client tool outputs (POST /v1/workflow-runs/{id}/tool-outputs)"
    elif run.status == "PAUSED":
        what = "someone to resume it"
    else:
        what = "a person's approval (stevora approve, or the UI)"
    text = (
        f"Run {run.id} is waiting for {what}; it goes on in Stevora once answered. Nothing is returned yet."
    )
    return CallToolResult(
        content=[TextContent(type="text", text=text)],
        structured_content={"runId": run.id, "status": run.status, "waitingFor": what},
    )


def _error(text: str, structured: dict[str, Any] | None = None) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=text)], structured_content=structured, is_error=True
    )


async def serve_stdio(server: Server[Any]) -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def serve_http(server: Server[Any], host: str, port: int) -> None:
    import uvicorn

    app = server.streamable_http_app(host=host)
    uvicorn.run(app, host=host, port=port, log_level="warning")


def run_stdio(server: Server[Any]) -> None:
    anyio.run(serve_stdio, server)
