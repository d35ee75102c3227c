"""`/v1/approval-requests`: list (pending or decided), get, decide.

A decision resumes the run (`stevora.engine.steps.approval.decide_approval`): `approved` completes the
step; `edited` replaces `state[contentKey]` with `editedContent` and completes it; `rejected`
fails the step with APPROVAL_REJECTED (not retried), which fails the run.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from starlette.responses import Response

from stevora.api.deps import Auth, Ctx
from stevora.api.openapi import errors
from stevora.api.schemas.approvals import ApprovalOut, DecisionIn
from stevora.api.schemas.envelope import Envelope, ok
from stevora.db.reads import approvals as approval_reads
from stevora.engine.steps.approval import decide_approval
from stevora.errors import NotFoundError

router = APIRouter(prefix="/approval-requests", tags=["approvals"])
ApprovalId = Annotated[str, Path(description="An approval request id (apr_...).")]


@router.get("", response_model=Envelope[list[ApprovalOut]], summary="List approval requests")
async def list_approvals(
    auth: Auth,
    ctx: Ctx,
    pending: Annotated[
        bool | None, Query(description="true: awaiting a decision; false: decided, expired or cancelled.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="At most this many, newest first.")] = 100,
) -> Response:
    rows = await approval_reads.listed(ctx.rt.pool, auth.workspace_id, pending, limit)
    return ok([ApprovalOut.model_validate(r) for r in rows])


@router.get("/{approval_id}", response_model=Envelope[ApprovalOut], responses=errors(404), summary="Get one")
async def get_approval(approval_id: ApprovalId, auth: Auth, ctx: Ctx) -> Response:
    row = await approval_reads.get(ctx.rt.pool, auth.workspace_id, approval_id)
    if row is None:
        raise NotFoundError("Approval request not found", details={"approvalRequestId": approval_id})
    return ok(ApprovalOut.model_validate(row))


@router.post(
    "/{approval_id}/decide",
    response_model=Envelope[ApprovalOut],
    responses=errors(404, 409),
    summary="Approve, reject or edit",
)
async def decide(approval_id: ApprovalId, body: DecisionIn, auth: Auth, ctx: Ctx) -> Response:
    """409 INVALID_STATE_TRANSITION when already decided, expired or cancelled."""
    record = await decide_approval(
        ctx.rt, auth.workspace_id, approval_id, body.decision, body.edited_content, body.decided_by
    )
    row: dict[str, Any] = dict(record)
    return ok(ApprovalOut.model_validate(row))
