"""`/v1/workflow-runs/{id}/llm-calls` and `/tool-traces`: what the model was asked and answered,
and every tool call it made, in execution order."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from starlette.responses import Response

from stevora.api.deps import Auth, Ctx
from stevora.api.openapi import errors
from stevora.api.routers.runs import load_run
from stevora.api.schemas.envelope import Envelope, ok
from stevora.api.schemas.traces import LlmCallOut, ToolTraceOut
from stevora.db.reads import traces as trace_reads
from stevora.engine.steps import llm_mcp

router = APIRouter(prefix="/workflow-runs", tags=["traces"])
RunId = Annotated[str, Path(description="A workflow run id (wfrun_...).")]
StepName = Annotated[
    str | None, Query(alias="stepName", max_length=100, description="Only this step's records.")
]


@router.get(
    "/{run_id}/llm-calls",
    response_model=Envelope[list[LlmCallOut]],
    responses=errors(404),
    summary="A run's LLM calls",
)
async def list_llm_calls(run_id: RunId, auth: Auth, ctx: Ctx, step_name: StepName = None) -> Response:
    """Completed and failed calls (failed ones include fallback attempts), oldest first."""
    await load_run(ctx.rt, auth.workspace_id, run_id)
    calls = await trace_reads.calls(ctx.rt.pool, run_id, step_name)
    return ok([LlmCallOut.model_validate(c) for c in calls])


@router.get(
    "/{run_id}/tool-traces",
    response_model=Envelope[list[ToolTraceOut]],
    responses=errors(404),
    summary="A run's tool calls",
)
async def list_tool_traces(run_id: RunId, auth: Auth, ctx: Ctx, step_name: StepName = None) -> Response:
    """One record per executed tool call, in execution order (round, then position in the round)."""
    run = await load_run(ctx.rt, auth.workspace_id, run_id)
    traces = await trace_reads.tool_traces(ctx.rt.pool, run_id, step_name)
    mcp = await llm_mcp.offered_by_run(ctx.rt, run_id, run["definition_id"])
    return ok([_trace_out(t, mcp) for t in traces])


def _trace_out(row: Any, mcp: dict[str, llm_mcp.McpTool]) -> ToolTraceOut:
    out = ToolTraceOut.model_validate(row)
    tool = mcp.get(out.tool_name)
    if out.child_run_id is not None:
        out.source = "workflow"
    elif tool is not None:
        out.source, out.mcp_server, out.mcp_tool = "mcp", tool.server, tool.tool
        if tool.server_name:
            out.mcp_server_version = f"{tool.server_name} {tool.server_version or ''}".strip()
    return out
