"""LLM calls, tool traces and costs."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, computed_field

from stevora.api.schemas.envelope import ApiOut, Stored, Timestamp

CallStatus = Literal["completed", "failed"]


class LlmCallOut(ApiOut):
    id: str
    workflow_run_id: str
    step_run_id: str
    step_name: str
    round: int
    provider: str | None
    model: str
    status: CallStatus
    request: Annotated[dict[str, Any], Stored]
    response: Annotated[dict[str, Any] | None, Stored]
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    reasoning_tokens: int = Field(
        default=0,
        description="The part of outputTokens the model spent reasoning (OpenAI) or thinking (Anthropic); "
        "priced as output.",
    )
    cost_usd: float
    duration_ms: float
    time_to_first_token_ms: float | None = Field(
        default=None,
        description="Streamed calls: milliseconds from the start of the call to its first content or "
        "tool-call delta; null for calls that did not stream.",
    )
    finish_reason: str | None
    error: dict[str, Any] | None
    inherited_from: str | None = Field(
        default=None,
        description="In a fork or replay: the origin's model call this row was copied from (not executed by "
        "this run; docs/time-travel.md); null for the run's own.",
    )
    created_at: Timestamp

    @computed_field(  # type: ignore[prop-decorator]
        description='"compaction": an `llm` step\'s `compact` summary call (its request carries '
        '`compaction`, its response the summary; docs/long-horizon.md); "round": a round of the loop.'
    )
    @property
    def kind(self) -> Literal["round", "compaction"]:
        return "compaction" if "compaction" in (self.request or {}) else "round"


class ToolTraceOut(ApiOut):
    id: str
    workflow_run_id: str
    step_run_id: str
    llm_call_id: str | None = Field(
        description="The model call that asked for it; null for a `tool` step's call."
    )
    round: int
    sequence: int = Field(description="Position of the call among the tool calls of one model response.")
    tool_call_id: str
    tool_name: str
    input_json: Annotated[Any, Stored]
    output_json: Annotated[Any, Stored]
    status: CallStatus
    error: str | None
    error_code: str | None
    duration_ms: float
    idempotency_key: str
    child_run_id: str | None = Field(
        default=None, description="For a workflow called as a tool: the child run that answered the call."
    )
    goto_step: str | None = Field(
        default=None,
        description="The step the handler sent the run to with `ctx.goto` (the llm step ended after this round).",
    )
    inherited_from: str | None = Field(
        default=None,
        description="In a fork or replay: the origin's tool trace this row was copied from (not executed by "
        "this run; docs/time-travel.md); null for the run's own.",
    )
    source: Literal["tool", "workflow", "mcp"] = Field(
        default="tool",
        description="`mcp`: a tool of an MCP server (docs/mcp.md); `workflow`: a child run answered it; "
        "`tool`: a handler or a client-executed tool.",
    )
    mcp_server: str | None = Field(
        default=None, description="For an MCP call: the server's name as configured."
    )
    mcp_tool: str | None = Field(
        default=None, description="For an MCP call: the server's own (bare) tool name."
    )
    mcp_server_version: str | None = Field(
        default=None, description="For an MCP call: the server's name and version from initialize, as pinned."
    )
    created_at: Timestamp


class CostCallOut(ApiOut):
    step_name: str
    model: str
    input_tokens: int
    output_tokens: int
    cost_usd: float
    created_at: Timestamp
    status: CallStatus


class RunCostOut(ApiOut):
    workflow_run_id: str
    total_cost_usd: float
    total_input_tokens: int
    total_output_tokens: int
    calls: list[CostCallOut]


class ModelCostOut(ApiOut):
    model: str
    provider: str | None
    calls: int
    input_tokens: int
    output_tokens: int
    cost_usd: float


class CostSummaryOut(ApiOut):
    from_: Timestamp | None = Field(alias="from")
    to: Timestamp | None
    total_cost_usd: float
    total_input_tokens: int
    total_output_tokens: int
    run_count: int
    call_count: int
    by_model: list[ModelCostOut]
