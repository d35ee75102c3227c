"""`/v1/api-keys`: create (raw key shown once), list, revoke.

Who may create a key (docs/api/authentication.md):
* with `x-api-key`: a key in the caller's workspace;
* with a valid `x-admin-token` and `workspaceId` in the body: a key in that workspace;
* with neither, when no ADMIN_TOKEN is configured: the *first* key of `workspaceId` (bootstrap),
  refused once the workspace has any key, even a revoked one.
"""

from __future__ import annotations

from typing import Annotated

import asyncpg
from fastapi import APIRouter, Depends, Path, Request
from starlette.responses import Response

from stevora.api.auth import MISSING_KEY, admin_token_accepted, hash_key, new_api_key
from stevora.api.deps import Auth, Ctx, admin_token_header, api_key_header
from stevora.api.openapi import errors
from stevora.api.schemas.envelope import Envelope, ok
from stevora.api.schemas.workspaces import ApiKeyCreate, ApiKeyCreated, ApiKeyOut
from stevora.db.reads import keys as key_reads
from stevora.errors import AuthError, NotFoundError, ValidationError
from stevora.throttle.failed_auth import client_address

router = APIRouter(prefix="/api-keys", tags=["api-keys"])
KeyId = Annotated[str, Path(description="An API key id (key_...).")]


@router.post(
    "",
    status_code=201,
    response_model=Envelope[ApiKeyCreated],
    responses=errors(400, 401, 404, 429),
    summary="Create an API key",
)
async def create_api_key(
    request: Request,
    body: ApiKeyCreate,
    ctx: Ctx,
    api_key: Annotated[str | None, Depends(api_key_header)],
    admin_token: Annotated[str | None, Depends(admin_token_header)],
) -> Response:
    if api_key:
        principal = await ctx.keys.authenticate(ctx.rt, api_key, client_address(request))
        if body.workspace_id is not None and body.workspace_id != principal.workspace_id:
            raise NotFoundError("Workspace not found", details={"workspaceId": body.workspace_id})
        workspace_id, bootstrap = principal.workspace_id, False
    else:
        if admin_token is not None:
            address = client_address(request)
            if not admin_token_accepted(ctx.settings.admin_token, admin_token, ctx.keys.failures, address):
                raise AuthError("Invalid admin token")
        elif ctx.settings.admin_token is not None:
            raise AuthError(MISSING_KEY)
        if body.workspace_id is None:
            raise ValidationError.from_problems(
                [{"path": "workspaceId", "message": "workspaceId is required without an x-api-key header"}]
            )
        workspace_id, bootstrap = body.workspace_id, admin_token is None
    await ctx.limiter.hit(ctx.rt, workspace_id)
    raw = new_api_key()
    async with ctx.rt.pool.acquire() as conn, conn.transaction():
        await _lock_workspace(conn, workspace_id, bootstrap=bootstrap)
        row = await key_reads.insert(conn, workspace_id, body.name, hash_key(raw), raw[:8])
    return ok(ApiKeyCreated.model_validate({**row, "key": raw}), 201)


async def _lock_workspace(conn: asyncpg.Connection, workspace_id: str, *, bootstrap: bool) -> None:
    """The workspace must exist; for a bootstrap it must have no key yet. The row lock makes two
    concurrent bootstrap requests take turns, so only one of them can be first."""
    if not await key_reads.lock_workspace(conn, workspace_id):
        raise NotFoundError("Workspace not found", details={"workspaceId": workspace_id})
    if bootstrap and await key_reads.has_key(conn, workspace_id):
        raise AuthError(MISSING_KEY)


@router.get("", response_model=Envelope[list[ApiKeyOut]], summary="List the workspace's API keys")
async def list_api_keys(auth: Auth, ctx: Ctx) -> Response:
    rows = await key_reads.of_workspace(ctx.rt.pool, auth.workspace_id)
    return ok([ApiKeyOut.model_validate(r) for r in rows])


@router.delete(
    "/{key_id}", response_model=Envelope[ApiKeyOut], responses=errors(404), summary="Revoke an API key"
)
async def revoke_api_key(key_id: KeyId, auth: Auth, ctx: Ctx) -> Response:
    """Sets `revokedAt` (idempotent: revoking again keeps the first time). The key stops working
    at once in this process and within 5 s in others."""
    row = await key_reads.revoke(ctx.rt.pool, auth.workspace_id, key_id)
    if row is None:
        raise NotFoundError("API key not found", details={"apiKeyId": key_id})
    ctx.keys.forget(key_id)
    return ok(ApiKeyOut.model_validate(row))
