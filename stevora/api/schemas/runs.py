"""Workflow runs, their step runs and events."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator

from stevora.api.schemas.envelope import ApiIn, ApiOut, Stored, Timestamp
from stevora.definitions import Budget
from stevora.definitions.flow import MAX_PRIORITY, Concurrency
from stevora.statuses import RunStatus, StepStatus


class RunCreate(ApiIn):
    definition_id: str | None = Field(default=None, min_length=1, max_length=40, examples=["wfdef_abc123"])
    definition: dict[str, Any] | None = Field(
        default=None,
        description="Instead of `definitionId`: an ad-hoc definition (the body of `POST "
        "/v1/workflow-definitions`; `name` defaults to `adhoc`, `version` to a digest of the rest), "
        "stored on first use and reused after.",
    )
    input: dict[str, Any] = Field(default_factory=dict)
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=255)
    budget: Budget | None = Field(
        default=None,
        description="Overrides the definition's `budget`, field by field (null removes a limit), "
        "within the server's maximum (`STEVORA_MAX_RUN_*`; above it: 400 naming the field).",
    )
    concurrency: Concurrency | None = Field(
        default=None,
        description="Overrides the definition's `concurrency` (key template, limit, holdWhileWaiting): "
        "runs with the same rendered key share `limit` slots (docs/flow-control.md).",
    )
    priority: int | None = Field(
        default=None,
        ge=0,
        le=MAX_PRIORITY,
        description="Overrides the definition's `priority` (default 0): higher is claimed first; a "
        "waiting run gains one point per minute, so none starves.",
    )

    def definition_problem(self) -> dict[str, str] | None:
        """Exactly one of `definitionId` and `definition` (checked by the route, to name the field)."""
        if self.definition_id is None and self.definition is None:
            return {"path": "definitionId", "message": "Field required (or an ad-hoc `definition`)"}
        if self.definition_id is not None and self.definition is not None:
            return {"path": "definition", "message": "Give exactly one of definitionId or definition"}
        return None


class BudgetUsed(ApiOut):
    cost_cents: float = Field(description="The run's model spend so far (its totalCostCents).")
    model_calls: int = Field(description="Model calls made, failed ones included.")
    tool_calls: int = Field(description="Tool calls made, except calls of tools a step does not offer.")


class ToolOutputIn(ApiIn):
    # Exactly one of `output` (any JSON value, null included) or `error` (a message).
    model_config = ConfigDict(
        json_schema_extra={
            "oneOf": [
                {"required": ["output"], "properties": {"error": {"type": "null"}}},
                {
                    "required": ["error"],
                    "properties": {"error": {"type": "string"}},
                    "not": {"required": ["output"]},
                },
            ]
        }
    )

    tool_call_id: str = Field(min_length=1, max_length=200, description="The model's tool-call id.")
    output: Any = Field(default=None, description="The tool's result: any JSON value.")
    error: str | None = Field(
        default=None, min_length=1, max_length=10_000, description="Instead of `output`: the call failed."
    )

    @model_validator(mode="after")
    def _output_or_error(self) -> ToolOutputIn:
        given = ("output" in self.model_fields_set) + (self.error is not None)
        if given != 1:
            raise ValueError("Give exactly one of output or error")
        return self


class ToolOutputsIn(ApiIn):
    tool_outputs: list[ToolOutputIn] = Field(min_length=1, max_length=128)


class PendingToolCall(ApiOut):
    id: str = Field(description="The model's tool-call id: answer with it as `toolCallId`.")
    name: str
    arguments: Any = Field(
        description='The parsed arguments (`{"raw": "..."}` when the model sent invalid JSON).'
    )


class RequiredAction(ApiOut):
    type: Literal["submit_tool_outputs"] = "submit_tool_outputs"
    tool_calls: list[PendingToolCall]


class ResumeIn(ApiIn):
    signal_type: str | None = Field(
        default=None,
        min_length=1,
        max_length=100,
        description="Required unless the run is PAUSED (without it, another status answers 409).",
    )
    payload: dict[str, Any] | None = Field(default=None, description="Shallow-merged into the run's state.")


class RunOut(ApiOut):
    id: str = Field(examples=["wfrun_def456"])
    workspace_id: str
    definition_id: str
    status: RunStatus
    current_step_name: str | None
    input: Annotated[dict[str, Any], Stored]
    state: Annotated[dict[str, Any], Stored]
    output: Annotated[dict[str, Any] | None, Stored]
    error: Annotated[dict[str, Any] | None, Stored]
    total_cost_cents: float
    total_input_tokens: int
    total_output_tokens: int
    started_at: Timestamp | None
    completed_at: Timestamp | None
    failed_at: Timestamp | None
    cancelled_at: Timestamp | None
    next_run_at: Timestamp | None
    idempotency_key: str | None
    version: int
    parent_run_id: str | None = Field(
        default=None,
        description="The run whose model called this workflow as a tool, or whose map step started it.",
    )
    parent_tool_call_id: str | None = Field(
        default=None, description="The model's tool-call id in the parent."
    )
    required_action: RequiredAction | None = Field(
        default=None, description="The client-executed tool calls this run waits for, in the model's order."
    )
    budget: dict[str, Any] | None = Field(
        default=None,
        description="The limits this run is held to: maxCostCents, maxModelCalls, maxToolCalls, "
        "onBudgetExceeded. Null: no limit.",
    )
    concurrency_key: str | None = Field(
        default=None, description="The run's rendered concurrency key (docs/flow-control.md)."
    )
    concurrency_limit: int | None = Field(
        default=None, description="How many runs of the key may run at once."
    )
    priority: int = Field(default=0, description="Higher is claimed first.")
    queued_at: Timestamp | None = Field(
        default=None,
        description="Since when the run waits for a concurrency slot (status PENDING): null when it "
        "is not queued.",
    )
    thread_id: str | None = Field(
        default=None, description="The thread this run is a turn of (docs/threads.md)."
    )
    created_at: Timestamp
    updated_at: Timestamp


class RunListItemOut(RunOut):
    """A run in a list page: `input`, `state` or `output` too large for the page's share is `null`
    here and named in `omittedFields`; `GET /v1/workflow-runs/{id}` has it."""

    input: Annotated[dict[str, Any] | None, Stored]  # type: ignore[assignment]
    state: Annotated[dict[str, Any] | None, Stored]  # type: ignore[assignment]
    omitted_fields: list[str] = Field(
        default_factory=list,
        description="Large fields left out of this list item (`input`, `state`, `output`); fetch the run.",
    )
    definition: DefinitionRef | None = Field(
        default=None, description="The name and version of the run's definition."
    )


class MapProgressOut(ApiOut):
    """A `map` step run's fan-out: how many of its items' child runs are done, out, failed."""

    total: int = Field(description="Items to run (one child run each).")
    done: int = Field(description="Items whose child run ended (completed + failed).")
    completed: int
    failed: int = Field(description="Items whose child run failed or was cancelled.")
    running: int = Field(description="Child runs out now (at most `concurrency`).")
    concurrency: int
    on_item_failure: str


class StepRunOut(ApiOut):
    id: str = Field(examples=["srun_aaa111"])
    workflow_run_id: str
    step_name: str
    step_type: str
    step_index: int
    status: StepStatus
    visit: int
    attempt: int
    input: Annotated[dict[str, Any] | None, Stored]
    output: Annotated[dict[str, Any] | None, Stored]
    error: Annotated[dict[str, Any] | None, Stored]
    signal_type: str | None
    wait_until: Timestamp | None
    started_at: Timestamp | None
    completed_at: Timestamp | None
    duration_ms: int | None = Field(description="completedAt - startedAt, when both are set.")
    created_at: Timestamp
    updated_at: Timestamp
    map: MapProgressOut | None = Field(
        default=None, description="For a `map` step run that started its items: their progress."
    )


class DefinitionRef(ApiOut):
    name: str
    version: str


class RunDetailOut(RunOut):
    step_runs: list[StepRunOut]
    definition: DefinitionRef
    budget_used: BudgetUsed | None = Field(
        default=None, description="What the run has used of its budget (null when it has none)."
    )
    queue_position: int | None = Field(
        default=None,
        description="For a queued run: its place in its concurrency key's queue (1: next to start).",
    )


class EventOut(ApiOut):
    id: str = Field(examples=["evt_001"])
    workflow_run_id: str
    step_run_id: str | None
    sequence: int = Field(description="1, 2, 3, ... per run, in commit order, without gaps.")
    event_type: str = Field(examples=["STEP_COMPLETED"])
    payload: Annotated[dict[str, Any], Stored]
    created_at: Timestamp
