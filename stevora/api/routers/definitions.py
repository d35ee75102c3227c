"""`/v1/workflow-definitions`: create (validated, immutable), list, get."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Path, Query
from starlette.responses import Response

from stevora.api.deps import Auth, Ctx, Paging
from stevora.api.openapi import definition_body, errors
from stevora.api.schemas.definitions import DefinitionOut
from stevora.api.schemas.envelope import Envelope, Page, ok, page
from stevora.db import mcp as db_mcp
from stevora.db.definitions import find_version
from stevora.db.reads import definitions as definition_reads
from stevora.db.reads.definitions import DefinitionRow
from stevora.definitions import (
    MapStep,
    McpToolsDef,
    WorkflowDefinitionSpec,
    WorkflowToolDef,
    parse_definition,
)
from stevora.engine import limits
from stevora.errors import ConflictError, NotFoundError, ValidationError
from stevora.runtime import Runtime
from stevora.triggers import definitions as triggers

router = APIRouter(prefix="/workflow-definitions", tags=["workflow-definitions"])
DefinitionId = Annotated[str, Path(description="A workflow definition id (wfdef_...).")]


@router.post(
    "",
    status_code=201,
    response_model=Envelope[DefinitionOut],
    responses=errors(409),
    openapi_extra=definition_body(),
    summary="Create a workflow definition",
)
async def create_definition(auth: Auth, ctx: Ctx, body: Annotated[dict[str, Any], Body()]) -> Response:
    """Validated with every problem reported at once; `(name, version)` is unique per workspace."""
    limits.check_definition(ctx.settings, body, "body")
    spec = parse_definition(body)
    row, created = await store_definition(ctx.rt, auth.workspace_id, spec)
    if not created:
        raise ConflictError(
            f"Workflow definition '{spec.name}' version '{spec.version}' already exists",
            details={"name": spec.name, "version": spec.version},
        )
    return ok(DefinitionOut.model_validate(row), 201)


async def store_definition(
    rt: Runtime, workspace_id: str, spec: WorkflowDefinitionSpec
) -> tuple[DefinitionRow, bool]:
    """Insert a validated definition; `(row, True)`, or `(the stored row, False)` when its
    `(name, version)` exists already (the unique index decides, race-safe)."""
    await check_workflow_tools(rt, workspace_id, spec)
    await check_mcp_servers(rt, workspace_id, spec)
    dump = spec.model_dump(by_alias=True, exclude_none=True, mode="json")
    row = await definition_reads.insert(
        rt.pool,
        workspace_id,
        {
            "name": spec.name,
            "version": spec.version,
            "description": spec.description,
            "steps": dump["steps"],
            "input_schema": spec.input_schema,
            "default_params": spec.default_params,
            "budget": dump.get("budget"),
            "concurrency": dump.get("concurrency"),
            "priority": spec.priority,
            "schedule": dump.get("schedule"),
            "triggers": dump.get("triggers"),
        },
    )
    if row is not None:
        await triggers.sync(rt, workspace_id, row["id"], spec)  # its schedule and event triggers
        return row, True
    existing = await definition_reads.version(rt.pool, workspace_id, spec.name, spec.version)
    if existing is None:  # cannot happen (definitions are not deleted); never answer with nothing
        raise ConflictError(f"Workflow definition '{spec.name}' version '{spec.version}' already exists")
    return existing, False


async def check_workflow_tools(rt: Runtime, workspace_id: str, spec: WorkflowDefinitionSpec) -> None:
    """A workflow tool or a `map` step must name a definition of this workspace (or this one: a definition may
    name itself, and its runs then get a clear recursion error instead of a runaway)."""
    named: list[tuple[str, str, str | None]] = []  # (path, workflow, version)
    for step_index, step in enumerate(spec.steps):
        if isinstance(step, MapStep):  # a `map` step's workflow, the same way
            named.append((f"steps[{step_index}].workflow", step.workflow, step.version))
        for tool_index, tool in enumerate(getattr(step, "tools", ())):
            if isinstance(tool, WorkflowToolDef):
                named.append(
                    (f"steps[{step_index}].tools[{tool_index}].workflow", tool.workflow, tool.version)
                )
    problems = []
    for path, workflow, version in named:
        if workflow == spec.name:
            continue
        if await find_version(rt.pool, workspace_id, workflow, version) is None:
            what = f"'{workflow}'" + (f" version '{version}'" if version else "")
            problems.append(
                {"path": path, "message": f"Workflow definition {what} does not exist in this workspace"}
            )
    if problems:
        raise ValidationError.from_problems(problems)


async def check_mcp_servers(rt: Runtime, workspace_id: str, spec: WorkflowDefinitionSpec) -> None:
    """An `{"mcp": ...}` tools entry must name a server some worker declares (its published
    mcpServers) or this workspace registered (docs/mcp.md)."""
    named = [
        (f"steps[{step_index}].tools[{tool_index}].mcp", tool.mcp)
        for step_index, step in enumerate(spec.steps)
        for tool_index, tool in enumerate(getattr(step, "tools", ()))
        if isinstance(tool, McpToolsDef)
    ]
    if not named:
        return
    known = await db_mcp.known_server_names(rt.pool, workspace_id)
    problems = [
        {
            "path": path,
            "message": f"MCP server '{server}' is not declared by any worker (mcpServers) nor registered in "
            "this workspace (POST /v1/mcp-servers)",
        }
        for path, server in named
        if server not in known
    ]
    if problems:
        raise ValidationError.from_problems(problems)


@router.get("", response_model=Page[DefinitionOut], summary="List workflow definitions")
async def list_definitions(
    auth: Auth,
    ctx: Ctx,
    paging: Paging,
    name: Annotated[str | None, Query(max_length=200, description="Only definitions with this name.")] = None,
) -> Response:
    """Newest first."""
    total = await definition_reads.count(ctx.rt.pool, auth.workspace_id, name)
    rows = []
    if paging.offset < total:  # the page query is skipped past the end
        rows = await definition_reads.page(
            ctx.rt.pool, auth.workspace_id, name, offset=paging.offset, limit=paging.page_size
        )
    data = [DefinitionOut.model_validate(r) for r in rows]
    return page(data, page=paging.page, page_size=paging.page_size, total=total)


@router.get(
    "/{definition_id}",
    response_model=Envelope[DefinitionOut],
    responses=errors(404),
    summary="Get a definition",
)
async def get_definition(definition_id: DefinitionId, auth: Auth, ctx: Ctx) -> Response:
    row = await definition_reads.get(ctx.rt.pool, auth.workspace_id, definition_id)
    if row is None:
        raise NotFoundError("Workflow definition not found", details={"definitionId": definition_id})
    return ok(DefinitionOut.model_validate(row))
