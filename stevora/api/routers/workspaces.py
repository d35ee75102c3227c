"""`POST /v1/workspaces` (open, or gated by ADMIN_TOKEN) and `GET /v1/workspaces/current`."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from stevora.api.auth import require_admin_if_configured
from stevora.api.deps import Auth, Ctx, admin_token_header
from stevora.api.openapi import errors
from stevora.api.schemas.envelope import Envelope, ok
from stevora.api.schemas.workspaces import WorkspaceCreate, WorkspaceOut
from stevora.db.reads import keys as key_reads
from stevora.errors import ConflictError, NotFoundError
from stevora.throttle.failed_auth import client_address

router = APIRouter(prefix="/workspaces", tags=["workspaces"])


@router.post(
    "",
    status_code=201,
    response_model=Envelope[WorkspaceOut],
    responses=errors(400, 401, 409, 429),
    summary="Create a workspace",
)
async def create_workspace(
    request: Request,
    body: WorkspaceCreate,
    ctx: Ctx,
    admin_token: Annotated[str | None, Depends(admin_token_header)],
) -> Response:
    """Open unless the server has ADMIN_TOKEN, then `x-admin-token` must match it."""
    require_admin_if_configured(
        ctx.settings.admin_token, admin_token, ctx.keys.failures, client_address(request)
    )
    row = await key_reads.insert_workspace(ctx.rt.pool, body.name, body.slug)
    if row is None:
        raise ConflictError(
            f"A workspace with slug '{body.slug}' already exists", details={"slug": body.slug}
        )
    return ok(WorkspaceOut.model_validate(row), 201)


@router.get(
    "/current", response_model=Envelope[WorkspaceOut], responses=errors(404), summary="The key's workspace"
)
async def current_workspace(auth: Auth, ctx: Ctx) -> Response:
    row = await key_reads.workspace(ctx.rt.pool, auth.workspace_id)
    if row is None:  # deleted under a cached key
        raise NotFoundError("Workspace not found")
    return ok(WorkspaceOut.model_validate(row))
