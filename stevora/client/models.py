"""Typed results of the client: the API's camelCase JSON as snake_case pydantic models.

Every model accepts fields it does not know (`extra="allow"`, reachable as `model.model_extra`),
so a newer server never breaks an older client; statuses are plain strings for the same reason.
Timestamps are parsed into timezone-aware datetimes.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from stevora.events import TERMINAL_EVENT_TYPES
from stevora.statuses import TERMINAL_RUN_STATUSES, RunStatus, values

T = TypeVar("T")

RUN_STATUSES = values(RunStatus)
TERMINAL_STATUSES = TERMINAL_RUN_STATUSES
TERMINAL_EVENTS = TERMINAL_EVENT_TYPES


class Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")


class PageMeta(Model):
    page: int
    page_size: int
    total: int
    total_pages: int


class Page(Model, Generic[T]):
    """One page of a paginated list: `.data` and `.meta` (page, page_size, total, total_pages)."""

    data: list[T]
    meta: PageMeta

    @property
    def has_next(self) -> bool:
        return self.meta.page < self.meta.total_pages


class Health(Model):
    status: str
    checks: dict[str, str] = Field(default_factory=dict)


class Workspace(Model):
    id: str
    name: str
    slug: str
    created_at: datetime | None = None
    updated_at: datetime | None = None


class ApiKey(Model):
    id: str
    workspace_id: str
    name: str
    key_prefix: str | None = None
    last_used_at: datetime | None = None
    created_at: datetime | None = None
    revoked_at: datetime | None = None


class CreatedApiKey(ApiKey):
    key: str
    """The raw `stv_...` key. The server shows it only once."""


class WorkflowDefinition(Model):
    id: str
    workspace_id: str | None = None
    name: str
    version: str
    description: str | None = None
    steps: list[dict[str, Any]] = Field(default_factory=list)
    created_at: datetime | None = None
    updated_at: datetime | None = None


class DefinitionRef(Model):
    name: str
    version: str


class MapProgress(Model):
    """A `map` step run's progress: its items' child runs done, out and failed."""

    total: int
    done: int
    completed: int
    failed: int
    running: int
    concurrency: int
    on_item_failure: str


class StepRun(Model):
    id: str
    workflow_run_id: str
    step_name: str
    step_type: str
    step_index: int | None = None
    status: str
    visit: int | None = None
    attempt: int = 1
    input: dict[str, Any] | None = None
    output: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    signal_type: str | None = None
    wait_until: datetime | None = None
    started_at: datetime | None = None
    completed_at: datetime | None = None
    duration_ms: int | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    map: MapProgress | None = None  # for a `map` step run


class PendingToolCall(Model):
    """A client-executed tool call the run waits for."""

    id: str
    """The model's tool-call id: answer with it (`ToolOutput(call.id, output=...)`)."""
    name: str
    arguments: Any = None
    """The parsed arguments (`{"raw": "..."}` when the model sent invalid JSON)."""


class RequiredAction(Model):
    """What a WAITING run needs from the caller: `submit_tool_outputs` for `tool_calls`."""

    type: str = "submit_tool_outputs"
    tool_calls: list[PendingToolCall] = Field(default_factory=list)


class WorkflowRun(Model):
    id: str
    workspace_id: str | None = None
    definition_id: str
    status: str
    current_step_name: str | None = None
    input: dict[str, Any] | None = Field(default_factory=dict)
    """None only in a list page that left it out (named in `omitted_fields`): `workflows.get` has it."""
    state: dict[str, Any] | None = Field(default_factory=dict)
    output: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    omitted_fields: list[str] = Field(default_factory=list)
    """Large fields a list page left out (`input`, `state`, `output`); see docs/security.md."""
    total_cost_cents: float = 0.0
    total_input_tokens: int = 0
    total_output_tokens: int = 0
    started_at: datetime | None = None
    completed_at: datetime | None = None
    failed_at: datetime | None = None
    cancelled_at: datetime | None = None
    next_run_at: datetime | None = None
    idempotency_key: str | None = None
    version: int | None = None
    parent_run_id: str | None = None
    """The run whose model called this workflow as a tool."""
    parent_tool_call_id: str | None = None
    """The model's tool-call id in the parent run."""
    required_action: RequiredAction | None = None
    """The client-executed tool calls this run waits for (None when nothing is pending)."""
    budget: dict[str, Any] | None = None
    """The limits the run is held to (`maxCostCents`, `maxModelCalls`, `maxToolCalls`,
    `onBudgetExceeded`); None: no limit."""
    budget_used: dict[str, Any] | None = None
    """What it has used of them (`costCents`, `modelCalls`, `toolCalls`); only on `workflows.get`
    and `workflows.set_budget`."""
    concurrency_key: str | None = None
    """The run's rendered concurrency key (docs/flow-control.md); None: none."""
    concurrency_limit: int | None = None
    priority: int = 0
    queued_at: datetime | None = None
    """Since when the run waits for a concurrency slot (None: not queued)."""
    queue_position: int | None = None
    """For a queued run, its place in its key's queue (1: next); only on `workflows.get`."""
    created_at: datetime | None = None
    updated_at: datetime | None = None
    step_runs: list[StepRun] | None = None
    """Only on `workflows.get`."""
    definition: DefinitionRef | None = None
    """Only on `workflows.get`."""
    created: bool | None = Field(default=None, exclude=True)
    """Set by `workflows.create`: True for a new run (201), False when the idempotency key
    matched an existing run (200)."""

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def total_cost_usd(self) -> float:
        return self.total_cost_cents / 100


class Event(Model):
    id: str
    workflow_run_id: str
    step_run_id: str | None = None
    sequence: int
    event_type: str
    payload: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime | None = None


class LlmCall(Model):
    id: str
    workflow_run_id: str
    step_run_id: str | None = None
    step_name: str
    round: int
    provider: str | None = None
    model: str
    status: str
    request: dict[str, Any] = Field(default_factory=dict)
    response: dict[str, Any] | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0  # a part of output_tokens: reasoning (OpenAI) or thinking (Anthropic)
    cost_usd: float = 0.0
    duration_ms: float | None = None
    time_to_first_token_ms: float | None = None  # streamed calls only
    finish_reason: str | None = None
    error: dict[str, Any] | None = None
    inherited_from: str | None = None
    """In a fork or replay: the origin's model call this one was copied from (not made by this run)."""
    created_at: datetime | None = None


class ToolTrace(Model):
    id: str
    workflow_run_id: str
    step_run_id: str | None = None
    llm_call_id: str | None = None
    round: int
    sequence: int
    tool_call_id: str | None = None
    tool_name: str
    input_json: Any = None
    output_json: Any = None
    status: str
    error: str | None = None
    error_code: str | None = None
    duration_ms: float | None = None
    idempotency_key: str | None = None
    child_run_id: str | None = None
    """For a workflow called as a tool: the child run that answered the call."""
    goto_step: str | None = None
    """The step the handler sent the run to with `ctx.goto` (the llm step ended after this round)."""
    inherited_from: str | None = None
    """In a fork or replay: the origin's tool trace this one was copied from (not run by this run)."""
    created_at: datetime | None = None


class CostCall(Model):
    step_name: str
    model: str
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    status: str | None = None
    created_at: datetime | None = None


class RunCost(Model):
    workflow_run_id: str
    total_cost_usd: float
    total_input_tokens: int
    total_output_tokens: int
    calls: list[CostCall] = Field(default_factory=list)


class ModelCost(Model):
    model: str
    provider: str | None = None
    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0


class CostSummary(Model):
    from_: datetime | None = Field(default=None, alias="from")
    to: datetime | None = None
    total_cost_usd: float
    total_input_tokens: int
    total_output_tokens: int
    run_count: int = 0
    call_count: int = 0
    by_model: list[ModelCost] = Field(default_factory=list)


class ApprovalRequest(Model):
    id: str
    workflow_run_id: str
    step_run_id: str | None = None
    step_name: str
    content_key: str | None = None
    content: Any = None
    prompt: str | None = None
    status: str | None = None
    decision: str | None = None
    edited_content: Any = None
    decided_by: str | None = None
    decided_at: datetime | None = None
    expires_at: datetime | None = None
    created_at: datetime | None = None

    @property
    def pending(self) -> bool:
        return self.decision is None and self.status in (None, "PENDING")


class Webhook(Model):
    id: str
    workspace_id: str | None = None
    url: str
    events: list[str]
    is_active: bool = True
    created_at: datetime | None = None
    updated_at: datetime | None = None


class CreatedWebhook(Webhook):
    secret: str
    """The `whsec_...` signing secret. The server shows it only once."""


class DeliveryAttempt(Model):
    attempt: int
    at: str | None = None
    status_code: int | None = None
    error: str | None = None
    duration_ms: float | None = None


class WebhookDelivery(Model):
    id: str
    webhook_id: str
    event: str
    payload: dict[str, Any] = Field(default_factory=dict)
    status: str
    attempts: int = 0
    next_attempt_at: datetime | None = None
    last_status_code: int | None = None
    last_error: str | None = None
    attempt_log: list[DeliveryAttempt] = Field(default_factory=list)
    delivered_at: datetime | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
