"""`/v1/mcp-servers`: a workspace's streamable HTTP MCP servers (docs/mcp.md), and the health of the
workers' own servers. Headers are secrets: stored for the workers' client, never returned."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path
from starlette.responses import Response

from stevora.api.deps import Auth, Ctx
from stevora.api.openapi import errors
from stevora.api.schemas.envelope import Envelope, ok
from stevora.api.schemas.mcp_servers import McpServerCreate, McpServerOut, McpServersOut, WorkerMcpServerOut
from stevora.db import mcp as db_mcp
from stevora.errors import ConflictError, NotFoundError, ValidationError
from stevora.webhooks.address import BlockedUrl, UnresolvedHost, check_webhook_url

router = APIRouter(prefix="/mcp-servers", tags=["mcp"])
ServerId = Annotated[str, Path(description="A registered MCP server's id (mcps_...).")]


def _out(row: Any) -> McpServerOut:
    return McpServerOut(
        id=row["id"],
        name=row["name"],
        url=row["url"],
        header_names=sorted(row["headers"] or {}),
        timeout_ms=row["timeout_ms"],
        created_at=row["created_at"],
    )


@router.post(
    "",
    status_code=201,
    response_model=Envelope[McpServerOut],
    responses=errors(400, 409),
    summary="Register an MCP server",
)
async def register_server(body: McpServerCreate, auth: Auth, ctx: Ctx) -> Response:
    """A streamable HTTP server this workspace's `llm` steps may offer (`{"mcp": "<name>"}`). URLs
    that resolve to private, loopback or link-local addresses are refused (400, `url`) unless
    STEVORA_MCP_ALLOW_PRIVATE is set. A name a worker's mcpServers file declares is taken (409)."""
    try:
        await check_webhook_url(body.url, allow_private=ctx.settings.mcp_allow_private)
    except BlockedUrl as exc:
        raise ValidationError.from_problems([{"path": "url", "message": str(exc)}]) from None
    except UnresolvedHost:
        pass  # accepted, as for webhooks: DNS may not be set up yet
    if body.name in {row["name"] for row in await db_mcp.worker_servers(ctx.rt.pool)}:
        raise ConflictError(
            f"MCP server name '{body.name}' is declared by a worker's mcpServers file",
            details={"name": body.name},
        )
    row = await db_mcp.register(
        ctx.rt.pool, auth.workspace_id, body.name, body.url, dict(body.headers), body.timeout_ms
    )
    if row is None:
        raise ConflictError(
            f"This workspace already has an MCP server named '{body.name}'", details={"name": body.name}
        )
    return ok(_out(row), 201)


@router.get("", response_model=Envelope[McpServersOut], summary="List MCP servers and their health")
async def list_servers(auth: Auth, ctx: Ctx) -> Response:
    """This workspace's registered servers, and every worker's own servers as last published."""
    registered = [_out(row) for row in await db_mcp.registrations(ctx.rt.pool, auth.workspace_id)]
    workers = [
        WorkerMcpServerOut.model_validate(dict(row)) for row in await db_mcp.worker_servers(ctx.rt.pool)
    ]
    return ok(McpServersOut(registered=registered, workers=workers))


@router.delete(
    "/{server_id}", status_code=204, responses=errors(404), summary="Remove a registered MCP server"
)
async def delete_server(server_id: ServerId, auth: Auth, ctx: Ctx) -> Response:
    """Runs that pinned its tools keep their lists; their next call of it fails (unknown server)."""
    if not await db_mcp.unregister(ctx.rt.pool, auth.workspace_id, server_id):
        raise NotFoundError("MCP server not found", details={"serverId": server_id})
    return Response(status_code=204)
