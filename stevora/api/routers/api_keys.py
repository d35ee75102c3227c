"""`/v1/api-keys`: create (raw key shown once), list, revoke.

Who may create a key (docs/api/authentication.md):
* with `x-api-key`: a key in the caller's workspace;
* with a valid `x-admin-token` and `workspaceId` in the body: a key in that workspace;
* with neither, when no ADMIN_TOKEN is configured: the *first* key of `workspaceId` (bootstrap),
  refused once the workspace has any key, even a revoked one.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request
from sqlalchemy.ext.asyncio import AsyncConnection
from starlette.responses import Response

from stevora.api.auth import MISSING_KEY, admin_token_accepted, hash_key, new_api_key
from stevora.api.db import fetch_all, write_one
from stevora.api.deps import Auth, Ctx, admin_token_header, api_key_header
from stevora.api.openapi import errors
from stevora.api.schemas.envelope import Envelope, ok
from stevora.api.schemas.workspaces import ApiKeyCreate, ApiKeyCreated, ApiKeyOut
from stevora.db import resources
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
    async with ctx.rt.engine.begin() as conn:
        await _lock_workspace(conn, workspace_id, bootstrap=bootstrap)
        insert = resources.insert_api_key(workspace_id, body.name, hash_key(raw), raw[:8])
        row = (await conn.execute(insert)).mappings().one()
    return ok(ApiKeyCreated.model_validate({**row, "key": raw}), 201)


async def _lock_workspace(conn: AsyncConnection, workspace_id: str, *, bootstrap: bool) -> None:
    """The workspace must exist; for a bootstrap it must have no key yet. The row lock makes two
    concurrent bootstrap requests take turns, so only one of them can be first."""
    found = (await conn.execute(resources.lock_workspace(workspace_id))).first()
    if found is None:
        raise NotFoundError("Workspace not found", details={"workspaceId": workspace_id})
    if bootstrap:
        has_key = (await conn.execute(resources.api_key_count(workspace_id))).scalar()
        if has_key:
            raise AuthError(MISSING_KEY)


@router.get("", response_model=Envelope[list[ApiKeyOut]], summary="List the workspace's API keys")
async def list_api_keys(auth: Auth, ctx: Ctx) -> Response:
    rows = await fetch_all(ctx.rt, resources.api_keys(auth.workspace_id))
    return ok([ApiKeyOut.model_validate(r) for r in rows])


@router.delete(
    "/{key_id}", response_model=Envelope[ApiKeyOut], responses=errors(404), summary="Revoke an API key"
)
async def revoke_api_key(key_id: KeyId, auth: Auth, ctx: Ctx) -> Response:
    """Sets `revokedAt` (idempotent: revoking again keeps the first time). The key stops working
    at once in this process and within 5 s in others."""
    row = await write_one(ctx.rt, resources.revoke_api_key(auth.workspace_id, key_id))
    if row is None:
        raise NotFoundError("API key not found", details={"apiKeyId": key_id})
    ctx.keys.forget(key_id)
    return ok(ApiKeyOut.model_validate(row))
