"""The API's statements, by resource: SQLAlchemy Core over the table models, built here and run by
the API's executors (`stevora.api.db`: connection-loss retry, rows as mappings). Routers say what
to read or write; the SQL lives here. Run mutations are not here: they are the engine's
(`stevora.engine.commands` and the answers in `stevora.engine.steps`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, TypeAlias

from sqlalchemy import (
    Insert,
    Select,
    delete,
    distinct,
    func,
    select,
)
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.sql.dml import ReturningDelete

from stevora.db.models import (
    ApiKey,
    ApprovalRequest,
    LlmCall,
    StepRun,
    ToolTrace,
    Webhook,
    WebhookDelivery,
    WorkflowDefinition,
    WorkflowEvent,
    WorkflowRun,
    Workspace,
)
from stevora.ids import new_id

# A SELECT of any columns.
Query: TypeAlias = Select[*tuple[Any, ...]]

RUNS = WorkflowRun.__table__
STEPS = StepRun.__table__
CALLS = LlmCall.__table__
TRACES = ToolTrace.__table__
EVENTS = WorkflowEvent.__table__
APPROVALS = ApprovalRequest.__table__
HOOKS = Webhook.__table__
DELIVERIES = WebhookDelivery.__table__
DEFINITIONS = WorkflowDefinition.__table__
DEFINITION_COLUMNS = tuple(DEFINITIONS.c)
WORKSPACE_COLUMNS = (Workspace.id, Workspace.name, Workspace.slug, Workspace.created_at, Workspace.updated_at)
API_KEY_COLUMNS = (
    ApiKey.id,
    ApiKey.workspace_id,
    ApiKey.name,
    ApiKey.key_prefix,
    ApiKey.last_used_at,
    ApiKey.created_at,
    ApiKey.revoked_at,
)


def page_statements(
    source: Any,
    where: Sequence[Any],
    order_by: Sequence[Any],
    offset: int,
    limit: int,
    columns: Sequence[Any] | None = None,
) -> tuple[Query, Query]:
    """(the count of `source` rows matching `where`, one page of them in `order_by` order)."""
    count = select(func.count()).select_from(source).where(*where)
    rows = select(*(columns or [source])).where(*where).order_by(*order_by).offset(offset).limit(limit)
    return count, rows


# -- workflow runs ------------------------------------------------------------------------------



# -- traces and costs ---------------------------------------------------------------------------


def run_cost_calls(run_id: str) -> Query:
    return (
        select(
            LlmCall.step_name,
            LlmCall.model,
            LlmCall.input_tokens,
            LlmCall.output_tokens,
            LlmCall.cost_usd,
            LlmCall.created_at,
            LlmCall.status,
        )
        .where(LlmCall.workflow_run_id == run_id)
        .order_by(LlmCall.created_at, LlmCall.round, LlmCall.id)
    )


def _cost_where(
    workspace_id: str, start: datetime | None, end: datetime | None, include_replays: bool
) -> list[Any]:
    """A fork's inherited calls are its origin's (counted once, there); replays are left out
    unless `include_replays` (docs/time-travel.md)."""
    where = [WorkflowRun.workspace_id == workspace_id, LlmCall.inherited_from.is_(None)]
    if not include_replays:
        where.append(WorkflowRun.replay_of.is_(None))
    if start is not None:
        where.append(LlmCall.created_at >= start)
    if end is not None:
        where.append(LlmCall.created_at < end)
    return where


def cost_by_model(
    workspace_id: str, start: datetime | None, end: datetime | None, include_replays: bool = False
) -> Query:
    """Calls created in [start, end) of the workspace's runs, summed per (model, provider)."""
    return (
        select(
            LlmCall.model,
            LlmCall.provider,
            func.count().label("calls"),
            func.coalesce(func.sum(LlmCall.input_tokens), 0).label("input_tokens"),
            func.coalesce(func.sum(LlmCall.output_tokens), 0).label("output_tokens"),
            func.coalesce(func.sum(LlmCall.cost_usd), 0.0).label("cost_usd"),
        )
        .join(WorkflowRun, WorkflowRun.id == LlmCall.workflow_run_id)
        .where(*_cost_where(workspace_id, start, end, include_replays))
        .group_by(LlmCall.model, LlmCall.provider)
        .order_by(func.sum(LlmCall.cost_usd).desc(), LlmCall.model)
    )


def cost_run_count(
    workspace_id: str, start: datetime | None, end: datetime | None, include_replays: bool = False
) -> Query:
    """How many runs those calls belong to."""
    return (
        select(func.count(distinct(LlmCall.workflow_run_id)))
        .select_from(LlmCall)
        .join(WorkflowRun, WorkflowRun.id == LlmCall.workflow_run_id)
        .where(*_cost_where(workspace_id, start, end, include_replays))
    )


# -- approvals ----------------------------------------------------------------------------------




# -- workflow definitions -----------------------------------------------------------------------






# -- webhooks -----------------------------------------------------------------------------------


def insert_webhook(workspace_id: str, url: str, events: list[str], secret: str) -> Insert:
    return (
        insert(Webhook)
        .values(id=new_id("wh"), workspace_id=workspace_id, url=url, events=events, secret=secret)
        .returning(HOOKS)
    )


def webhooks(workspace_id: str) -> Query:
    return select(HOOKS).where(HOOKS.c.workspace_id == workspace_id).order_by(HOOKS.c.created_at, HOOKS.c.id)


def delete_webhook(workspace_id: str, webhook_id: str) -> ReturningDelete[*tuple[Any, ...]]:
    return (
        delete(Webhook).where(Webhook.id == webhook_id, Webhook.workspace_id == workspace_id).returning(HOOKS)
    )


def webhook_id(workspace_id: str, webhook_id: str) -> Query:
    return select(Webhook.id).where(Webhook.id == webhook_id, Webhook.workspace_id == workspace_id)


def deliveries_where(webhook_id: str, status: str | None) -> tuple[list[Any], list[Any]]:
    """(filters, order: newest first) of a webhook's deliveries."""
    where = [DELIVERIES.c.webhook_id == webhook_id]
    if status is not None:
        where.append(DELIVERIES.c.status == status)
    return where, [DELIVERIES.c.created_at.desc(), DELIVERIES.c.id.desc()]


# -- workspaces and API keys --------------------------------------------------------------------
