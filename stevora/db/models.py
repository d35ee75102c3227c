"""SQLAlchemy 2 table models. Alembic migrations are generated from (and checked against) these.

Statuses are the documented UPPERCASE enums stored as text with a CHECK constraint, so a bad
value can never be written even by hand-written SQL. JSON columns are JSONB, timestamps are
timestamptz, ids are prefixed strings (see stevora.ids).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Computed,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSON, JSONB, TSVECTOR
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from stevora.statuses import (
    ApprovalDecision,
    ApprovalStatus,
    AwaitedKind,
    AwaitedStatus,
    MapItemStatus,
    RunStatus,
    StepStatus,
    values,
)

RUN_STATUSES = values(RunStatus)
STEP_STATUSES = values(StepStatus)
APPROVAL_STATUSES = values(ApprovalStatus)
DELIVERY_STATUSES = ("PENDING", "DELIVERED", "FAILED")

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {dict[str, Any]: JSONB, list[Any]: JSONB, Any: JSONB}


def _ts(nullable: bool = True) -> Any:
    return mapped_column(DateTime(timezone=True), nullable=nullable)


def _created() -> Any:
    return mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())


class Workspace(Base):
    __tablename__ = "workspaces"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(100))
    slug: Mapped[str] = mapped_column(String(50), unique=True)
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = _created()


class ApiKey(Base):
    __tablename__ = "api_keys"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    workspace_id: Mapped[str] = mapped_column(ForeignKey("workspaces.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(100))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)  # SHA-256 hex of the raw stv_ key
    key_prefix: Mapped[str] = mapped_column(String(12))  # "stv_a1b2" for recognising a key in lists
    last_used_at: Mapped[datetime | None] = _ts()
    created_at: Mapped[datetime] = _created()
    revoked_at: Mapped[datetime | None] = _ts()


class WorkflowDefinition(Base):
    __tablename__ = "workflow_definitions"
    __table_args__ = (UniqueConstraint("workspace_id", "name", "version", name="uq_definition_version"),)
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    workspace_id: Mapped[str] = mapped_column(ForeignKey("workspaces.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    version: Mapped[str] = mapped_column(String(50))
    description: Mapped[str | None] = mapped_column(String(1000))
    steps: Mapped[list[Any]] = mapped_column(JSONB)  # validated camelCase step objects
    # What the workflow takes as input: a JSON Schema, or Dagu's `defaultParams` string. Either
    # becomes the parameters of the workflow when another run's model calls it as a tool.
    input_schema: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    default_params: Mapped[str | None] = mapped_column(Text)
    # The default budget of its runs (`Budget` as camelCase JSON); NULL: none.
    budget: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    # Flow control defaults of its runs (docs/flow-control.md): `{"key", "limit",
    # "holdWhileWaiting"}` as camelCase JSON, and a priority. NULL: none.
    concurrency: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    priority: Mapped[int | None] = mapped_column(Integer)
    # What starts its runs without a client (docs/triggers.md), as given; kept for reads and for
    # `definitions apply` (the live copies are the `schedules` and `event_triggers` rows).
    schedule: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    triggers: Mapped[list[Any] | None] = mapped_column(JSONB)
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = _created()


class WorkflowRun(Base):
    __tablename__ = "workflow_runs"
    __table_args__ = (
        CheckConstraint(_in("status", RUN_STATUSES), name="status"),
        UniqueConstraint("workspace_id", "idempotency_key", name="uq_run_idempotency_key"),
        Index("ix_runs_workspace_created", "workspace_id", "created_at"),
        # The recovery sweep's scans: due runs and undispatched / lease-expired runs.
        Index(
            "ix_runs_due",
            "next_run_at",
            postgresql_where=text("status IN ('PENDING', 'RUNNING', 'WAITING')"),
        ),
        Index("ix_runs_active", "status", postgresql_where=text("status IN ('PENDING', 'RUNNING')")),
        Index("ix_runs_parent", "parent_run_id", postgresql_where=text("parent_run_id IS NOT NULL")),
        Index(
            "ix_workflow_runs_forked_from_run_id",
            "forked_from_run_id",
            postgresql_where=text("forked_from_run_id IS NOT NULL"),
        ),
        # Flow control (stevora.db.concurrency): a key's slots and queue, and the pending runs of a
        # raised priority.
        Index(
            "ix_runs_concurrency_key",
            "workspace_id",
            "concurrency_key",
            "status",
            postgresql_where=text(
                "concurrency_key IS NOT NULL AND status IN ('PENDING', 'RUNNING', 'WAITING', 'PAUSED')"
            ),
        ),
        Index(
            "ix_runs_pending_priority",
            "priority",
            "created_at",
            postgresql_where=text("status = 'PENDING' AND priority > 0"),
        ),
        Index(
            "ix_runs_thread_created",
            "thread_id",
            "created_at",
            postgresql_where=text("thread_id IS NOT NULL"),
        ),
    )
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    workspace_id: Mapped[str] = mapped_column(ForeignKey("workspaces.id", ondelete="CASCADE"))
    definition_id: Mapped[str] = mapped_column(ForeignKey("workflow_definitions.id"), index=True)
    status: Mapped[str] = mapped_column(String(16), server_default="PENDING")
    current_step_name: Mapped[str | None] = mapped_column(String(100))
    current_step_run_id: Mapped[str | None] = mapped_column(String(40))
    input: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    state: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    output: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    total_cost_cents: Mapped[float] = mapped_column(Float, server_default="0")
    total_input_tokens: Mapped[int] = mapped_column(BigInteger, server_default="0")
    total_output_tokens: Mapped[int] = mapped_column(BigInteger, server_default="0")
    started_at: Mapped[datetime | None] = _ts()
    completed_at: Mapped[datetime | None] = _ts()
    failed_at: Mapped[datetime | None] = _ts()
    cancelled_at: Mapped[datetime | None] = _ts()
    next_run_at: Mapped[datetime | None] = _ts()
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    version: Mapped[int] = mapped_column(Integer, server_default="1")
    # Execution lease: only the owner may advance the run until lease_expires_at.
    lease_owner: Mapped[str | None] = mapped_column(String(80))
    lease_expires_at: Mapped[datetime | None] = _ts()
    dispatched_at: Mapped[datetime | None] = _ts()
    # Last allocated event sequence; incremented in the same statement that writes events.
    event_seq: Mapped[int] = mapped_column(Integer, server_default="0")
    # A run started by another run's model calling a workflow as a tool: its parent, the model's
    # tool-call id there, and how deep in such a chain it is (a root run is depth 1).
    parent_run_id: Mapped[str | None] = mapped_column(ForeignKey("workflow_runs.id", ondelete="CASCADE"))
    parent_tool_call_id: Mapped[str | None] = mapped_column(String(200))
    depth: Mapped[int] = mapped_column(Integer, server_default="1")
    # W3C trace context (`traceparent`, `tracestate`) of the span that created the run: every
    # worker execution continues that trace (docs/observability.md). NULL when tracing was off.
    trace_context: Mapped[dict[str, str] | None] = mapped_column(JSONB)
    # The limits this run is held to (definition default, create override, server ceiling, later
    # raises), as camelCase JSON: docs/definitions.md#budgets. NULL: no limit.
    budget: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    # Time travel (docs/time-travel.md): the state the run started from (NULL: {}), the run and
    # point it was forked from (no foreign key: pruning an origin never breaks a fork), and for a
    # replay the run it replays and how its tool calls are answered ("recorded").
    initial_state: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    forked_from_run_id: Mapped[str | None] = mapped_column(String(40))
    forked_at_step: Mapped[str | None] = mapped_column(String(100))
    forked_at_round: Mapped[int | None] = mapped_column(Integer)
    fork_edits: Mapped[dict[str, Any] | None] = mapped_column(JSONB)  # {"state": ..., "toolResults": ...}
    replay_of: Mapped[str | None] = mapped_column(String(40))
    replay_tools: Mapped[str | None] = mapped_column(String(16))
    # Consecutive driver crashes and lease takeovers; reset when a step ends, waits or retries.
    # At STEVORA_MAX_RUN_CRASHES the run FAILS with RUN_CRASH_LIMIT (docs/security.md).
    crash_count: Mapped[int] = mapped_column(Integer, server_default="0")
    # Flow control (docs/flow-control.md): the rendered concurrency key and its limit, whether a
    # WAITING/PAUSED run keeps its slot, the workspace-wide limit in force when it was created,
    # its priority, and since when it has been queued for a slot (PENDING, no slot free).
    concurrency_key: Mapped[str | None] = mapped_column(Text)
    concurrency_limit: Mapped[int | None] = mapped_column(Integer)
    concurrency_hold_waiting: Mapped[bool] = mapped_column(Boolean, server_default=text("true"))
    workspace_limit: Mapped[int | None] = mapped_column(Integer)
    priority: Mapped[int] = mapped_column(Integer, server_default="0")
    queued_at: Mapped[datetime | None] = _ts()
    # The thread this run is a turn of (docs/threads.md); no foreign key: deleting a thread
    # leaves its turns' runs and their traces in place.
    thread_id: Mapped[str | None] = mapped_column(String(40))
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = _created()


class StepRun(Base):
    __tablename__ = "step_runs"
    __table_args__ = (
        CheckConstraint(_in("status", STEP_STATUSES), name="status"),
        UniqueConstraint("workflow_run_id", "step_name", "visit", "attempt", name="uq_step_attempt"),
    )
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    workflow_run_id: Mapped[str] = mapped_column(
        ForeignKey("workflow_runs.id", ondelete="CASCADE"), index=True
    )
    step_name: Mapped[str] = mapped_column(String(100))
    step_type: Mapped[str] = mapped_column(String(20))
    step_index: Mapped[int] = mapped_column(Integer)
    # visit counts entries into this step within the run (condition loops, manual retries);
    # attempt counts RetryPolicy attempts within one visit.
    visit: Mapped[int] = mapped_column(Integer, server_default="1")
    attempt: Mapped[int] = mapped_column(Integer, server_default="1")
    status: Mapped[str] = mapped_column(String(16), server_default="PENDING")
    input: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    output: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    signal_type: Mapped[str | None] = mapped_column(String(100))
    # The shallow state change the step's completion made (the state-change log) and, for a
    # fork's copy of a step run, the origin step run it stands for.
    state_updates: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    inherited_from: Mapped[str | None] = mapped_column(String(40))
    wait_until: Mapped[datetime | None] = _ts()
    started_at: Mapped[datetime | None] = _ts()
    completed_at: Mapped[datetime | None] = _ts()
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = _created()


class WorkflowEvent(Base):
    __tablename__ = "workflow_events"
    # Keyed by (run, sequence), the order every reader pages in; `id` is a generated id looked up
    # only with its run (a completion retried after a lost connection: transitions._not_completed),
    # so it has no index of its own (migration 0026: one index entry per event less).
    id: Mapped[str] = mapped_column(String(40))
    # No foreign key (migration 0029): the run's delete trigger deletes its events, model calls
    # and tool traces; a key cost a check and a lock of the run row for every row inserted.
    workflow_run_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    step_run_id: Mapped[str | None] = mapped_column(String(40))
    sequence: Mapped[int] = mapped_column(Integer, primary_key=True)
    event_type: Mapped[str] = mapped_column(String(40))
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    created_at: Mapped[datetime] = _created()


class LlmCall(Base):
    __tablename__ = "llm_calls"
    __table_args__ = (
        CheckConstraint("status IN ('completed', 'failed')", name="status"),
        # A round's successful model call is recorded once; failed attempts may be many.
        Index(
            "uq_llm_call_round",
            "step_run_id",
            "round",
            unique=True,
            postgresql_where=text("status = 'completed'"),
        ),
        Index("ix_llm_calls_run", "workflow_run_id", "created_at"),
    )
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    # Deleted with its run by the run's delete trigger (migration 0029), like `workflow_events`.
    workflow_run_id: Mapped[str] = mapped_column(String(40))
    # No foreign key to step_runs (migration 0026): a step run goes only with its run, whose
    # trigger deletes this row; a key here cost a check and a tuple lock on the step run every round.
    step_run_id: Mapped[str] = mapped_column(String(40))
    step_name: Mapped[str] = mapped_column(String(100))
    round: Mapped[int] = mapped_column(Integer)
    provider: Mapped[str | None] = mapped_column(String(40))
    model: Mapped[str] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(16))
    # Only what this call added to the conversation (first prompt, feedback); earlier rounds
    # are rebuilt from earlier rows, so storage grows linearly with rounds.
    request: Mapped[dict[str, Any]] = mapped_column(JSONB)
    response: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    input_tokens: Mapped[int] = mapped_column(Integer, server_default="0")
    output_tokens: Mapped[int] = mapped_column(Integer, server_default="0")
    cache_read_tokens: Mapped[int] = mapped_column(Integer, server_default="0")
    cache_write_tokens: Mapped[int] = mapped_column(Integer, server_default="0")
    cost_usd: Mapped[float] = mapped_column(Float, server_default="0")
    duration_ms: Mapped[float] = mapped_column(Float, server_default="0")
    # Streamed calls only: from the start of the call to its first content or tool-call delta.
    time_to_first_token_ms: Mapped[float | None] = mapped_column(Float)
    finish_reason: Mapped[str | None] = mapped_column(String(40))
    error: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    inherited_from: Mapped[str | None] = mapped_column(String(40))  # a fork's copy: the origin call
    created_at: Mapped[datetime] = _created()
    # The part of output_tokens the model spent reasoning or thinking (priced with them).
    reasoning_tokens: Mapped[int] = mapped_column(Integer, server_default="0")


class ToolTrace(Base):
    __tablename__ = "tool_trace"
    __table_args__ = (
        CheckConstraint("status IN ('completed', 'failed')", name="status"),
        # Exactly-once record per (model call, tool-call index) ...
        UniqueConstraint("llm_call_id", "sequence", name="uq_tool_trace_call"),
        # ... and per step run for a `tool` step's call (no model call).
        Index(
            "uq_tool_trace_tool_step",
            "step_run_id",
            unique=True,
            postgresql_where=text("llm_call_id IS NULL"),
        ),
        Index("ix_tool_trace_run", "workflow_run_id", "created_at"),
    )
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    # Deleted with its run by the run's delete trigger (migration 0029), like `workflow_events`.
    workflow_run_id: Mapped[str] = mapped_column(String(40))
    # No foreign keys to step_runs / llm_calls and no step-run index (migration 0026): both go only
    # with their run, whose trigger deletes this row (through ix_tool_trace_run); the keys cost two
    # checks and two tuple locks, the index an entry, on every tool call.
    step_run_id: Mapped[str] = mapped_column(String(40))
    llm_call_id: Mapped[str | None] = mapped_column(String(40))
    round: Mapped[int] = mapped_column(Integer)
    sequence: Mapped[int] = mapped_column(Integer)
    tool_call_id: Mapped[str] = mapped_column(String(200))
    tool_name: Mapped[str] = mapped_column(String(64))
    input_json: Mapped[Any] = mapped_column(JSONB, nullable=True)
    # `json`, not `jsonb`: kept as written (key order, numbers), so the transcript rebuilt from it
    # is byte for byte what the round first sent (migration 0020).
    output_json: Mapped[Any] = mapped_column(JSON, nullable=True)
    status: Mapped[str] = mapped_column(String(16))
    error: Mapped[str | None] = mapped_column(Text)
    error_code: Mapped[str | None] = mapped_column(String(40))
    # What the model was told for a failed call ({"error": ...}); a completed call's result is
    # rebuilt from output_json when the transcript is replayed.
    result_text: Mapped[str | None] = mapped_column(Text)
    duration_ms: Mapped[float] = mapped_column(Float, server_default="0")
    idempotency_key: Mapped[str] = mapped_column(String(120))
    # For a workflow called as a tool: the run that answered the call.
    child_run_id: Mapped[str | None] = mapped_column(String(40))
    # The tool's `update_state` (the state-change log) and, in a fork, the origin row copied.
    state_updates: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    # The step the handler sent the run to (`ctx.goto`), written with its result: the llm step
    # ends after this round and the run goes on there, even if a worker dies in between.
    goto_step: Mapped[str | None] = mapped_column(Text)
    inherited_from: Mapped[str | None] = mapped_column(String(40))
    created_at: Mapped[datetime] = _created()


class AwaitedToolCall(Base):
    """A tool call whose result is written by someone other than the loop: the API caller
    (`client`) or a child run (`workflow`). Written in the transaction that makes the step WAITING;
    answered by writing its tool_trace row (and marking it here) in one transaction."""

    __tablename__ = "awaited_tool_calls"
    __table_args__ = (
        CheckConstraint(_in("kind", values(AwaitedKind)), name="kind"),
        CheckConstraint(_in("status", values(AwaitedStatus)), name="status"),
        # One wait per (model call, tool-call index): a replayed round never creates a second
        # one (nor a second child run); a `tool` step's call has one per step run.
        UniqueConstraint("llm_call_id", "sequence", name="uq_awaited_tool_call"),
        Index(
            "uq_awaited_tool_step", "step_run_id", unique=True, postgresql_where=text("llm_call_id IS NULL")
        ),
        Index(
            "ix_awaited_pending",
            "workflow_run_id",
            postgresql_where=text(f"status = '{AwaitedStatus.PENDING}'"),
        ),
        Index("ix_awaited_child", "child_run_id", postgresql_where=text("child_run_id IS NOT NULL")),
    )
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    workflow_run_id: Mapped[str] = mapped_column(ForeignKey("workflow_runs.id", ondelete="CASCADE"))
    step_run_id: Mapped[str] = mapped_column(ForeignKey("step_runs.id", ondelete="CASCADE"))
    llm_call_id: Mapped[str | None] = mapped_column(ForeignKey("llm_calls.id", ondelete="CASCADE"))
    round: Mapped[int] = mapped_column(Integer)
    sequence: Mapped[int] = mapped_column(Integer)
    tool_call_id: Mapped[str] = mapped_column(String(200))
    tool_name: Mapped[str] = mapped_column(String(64))
    arguments: Mapped[Any] = mapped_column(JSONB, nullable=True)
    # Approval-gated calls: the argument schema (to check edited arguments at decision time) and
    # the arguments a person approved (the call then runs with them).
    parameters: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    approved_arguments: Mapped[Any] = mapped_column(JSONB, nullable=True)
    kind: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16), server_default=AwaitedStatus.PENDING.value)
    deadline_at: Mapped[datetime | None] = _ts()
    child_run_id: Mapped[str | None] = mapped_column(String(40))
    created_at: Mapped[datetime] = _created()
    answered_at: Mapped[datetime | None] = _ts()


class MapStep(Base):
    """A `map` step run's fan-out: what its child runs are and how many are out, done, failed.

    Written in the transaction that makes the step WAITING; its counters are kept by the child
    runs' endings, under the parent run's row lock."""

    __tablename__ = "map_steps"
    __table_args__ = (
        CheckConstraint("on_item_failure IN ('fail', 'continue')", name="on_item_failure"),
        Index("ix_map_steps_run_step", "workflow_run_id", "step_name"),
    )
    step_run_id: Mapped[str] = mapped_column(ForeignKey("step_runs.id", ondelete="CASCADE"), primary_key=True)
    workflow_run_id: Mapped[str] = mapped_column(ForeignKey("workflow_runs.id", ondelete="CASCADE"))
    step_name: Mapped[str] = mapped_column(String(100))
    child_definition_id: Mapped[str] = mapped_column(String(40))
    child_budget: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    concurrency: Mapped[int] = mapped_column(Integer)
    on_item_failure: Mapped[str] = mapped_column(String(16))
    total: Mapped[int] = mapped_column(Integer)
    running: Mapped[int] = mapped_column(Integer, server_default="0")
    completed: Mapped[int] = mapped_column(Integer, server_default="0")
    failed: Mapped[int] = mapped_column(Integer, server_default="0")
    created_at: Mapped[datetime] = _created()


class MapItem(Base):
    """One item of a `map` step run: its child input, its child run, and that run's result.

    One row per (step run, index): a replayed creation never starts a second child run. A retry
    of a failed map step copies the completed (and still running) items into the new step run,
    so only the failed ones run again; a copied running item shares its child run."""

    __tablename__ = "map_items"
    __table_args__ = (
        CheckConstraint(_in("status", values(MapItemStatus)), name="status"),
        Index("ix_map_items_child", "child_run_id", postgresql_where=text("child_run_id IS NOT NULL")),
        Index(
            "ix_map_items_pending", "step_run_id", "item_index", postgresql_where=text("status = 'pending'")
        ),
        Index("ix_map_items_unrecorded", "workflow_run_id", postgresql_where=text("unrecorded")),
    )
    # A child run's terminal statement ends its item (the map_child_ended trigger on workflow_runs,
    # migration 0028); stevora_map_record records the endings on the parent in batches.
    step_run_id: Mapped[str] = mapped_column(ForeignKey("step_runs.id", ondelete="CASCADE"), primary_key=True)
    item_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    workflow_run_id: Mapped[str] = mapped_column(ForeignKey("workflow_runs.id", ondelete="CASCADE"))
    input: Mapped[Any] = mapped_column(JSONB)
    status: Mapped[str] = mapped_column(String(16), server_default=MapItemStatus.PENDING.value)
    child_run_id: Mapped[str | None] = mapped_column(String(40))
    output: Mapped[Any] = mapped_column(JSONB, nullable=True)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    started_at: Mapped[datetime | None] = _ts()
    ended_at: Mapped[datetime | None] = _ts()
    passed_to: Mapped[int | None] = mapped_column(Integer)  # the item its ending started in its slot
    # Ended, not yet recorded on the parent (counts, events): stevora.engine.map_recorder's work.
    unrecorded: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))


class ApprovalRequest(Base):
    __tablename__ = "approval_requests"
    __table_args__ = (
        CheckConstraint(_in("status", APPROVAL_STATUSES), name="status"),
        CheckConstraint(f"decision IS NULL OR {_in('decision', values(ApprovalDecision))}", name="decision"),
        Index("ix_approvals_workspace_status", "workspace_id", "status"),
    )
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    workspace_id: Mapped[str] = mapped_column(ForeignKey("workspaces.id", ondelete="CASCADE"))
    workflow_run_id: Mapped[str] = mapped_column(
        ForeignKey("workflow_runs.id", ondelete="CASCADE"), index=True
    )
    step_run_id: Mapped[str] = mapped_column(ForeignKey("step_runs.id", ondelete="CASCADE"), index=True)
    # Set for the approval of an approval-gated tool call (one step run may wait for several).
    awaited_tool_call_id: Mapped[str | None] = mapped_column(String(40), unique=True)
    step_name: Mapped[str] = mapped_column(String(100))
    content_key: Mapped[str] = mapped_column(String(200))
    content: Mapped[Any] = mapped_column(JSONB, nullable=True)
    prompt: Mapped[str | None] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), server_default="PENDING")
    decision: Mapped[str | None] = mapped_column(String(16))
    edited_content: Mapped[Any] = mapped_column(JSONB, nullable=True)
    decided_by: Mapped[str | None] = mapped_column(String(200))
    decided_at: Mapped[datetime | None] = _ts()
    expires_at: Mapped[datetime | None] = _ts()
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = _created()


class Webhook(Base):
    __tablename__ = "webhooks"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    workspace_id: Mapped[str] = mapped_column(ForeignKey("workspaces.id", ondelete="CASCADE"), index=True)
    url: Mapped[str] = mapped_column(String(2000))
    events: Mapped[list[Any]] = mapped_column(JSONB)
    secret: Mapped[str] = mapped_column(String(80))  # needed in clear to sign deliveries
    is_active: Mapped[bool] = mapped_column(Boolean, server_default=text("true"))
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = _created()


class WebhookDelivery(Base):
    """Outbox row written in the same transaction as the change it announces."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        CheckConstraint(_in("status", DELIVERY_STATUSES), name="status"),
        Index("ix_deliveries_due", "next_attempt_at", postgresql_where=text("status = 'PENDING'")),
        Index("ix_deliveries_pending_by_webhook", "webhook_id", postgresql_where=text("status = 'PENDING'")),
    )
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    webhook_id: Mapped[str] = mapped_column(ForeignKey("webhooks.id", ondelete="CASCADE"), index=True)
    workspace_id: Mapped[str] = mapped_column(ForeignKey("workspaces.id", ondelete="CASCADE"))
    event: Mapped[str] = mapped_column(String(40))
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB)
    status: Mapped[str] = mapped_column(String(16), server_default="PENDING")
    attempts: Mapped[int] = mapped_column(Integer, server_default="0")
    next_attempt_at: Mapped[datetime | None] = _ts()
    last_status_code: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(Text)
    attempt_log: Mapped[list[Any]] = mapped_column(JSONB, server_default=text("'[]'::jsonb"))
    delivered_at: Mapped[datetime | None] = _ts()
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = _created()


class RateLimitBucket(Base):
    """A workspace's API token bucket, shared by every API process (stevora/throttle/workspace_requests.py)."""

    __tablename__ = "rate_limit_buckets"
    workspace_id: Mapped[str] = mapped_column(
        ForeignKey("workspaces.id", ondelete="CASCADE"), primary_key=True
    )
    tokens: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[datetime] = _created()


class ProviderRateLimit(Base):
    """A model's request and token buckets, shared by every worker process (docs/flow-control.md,
    "Provider rate limits"; stevora/engine/provider_limits.py). Both may go negative: a reservation
    of a call that waits for its turn."""

    __tablename__ = "provider_rate_limits"
    __table_args__ = {"prefixes": ["UNLOGGED"]}  # soft state: no WAL flush per update
    key: Mapped[str] = mapped_column(Text, primary_key=True)  # "provider:model", as configured
    requests: Mapped[float] = mapped_column(Float)
    tokens: Mapped[float] = mapped_column(Float)
    # The share of the configured limits in force: a provider 429 lowers it, answered calls raise it.
    scale: Mapped[float] = mapped_column(Float, server_default=text("1"))
    updated_at: Mapped[datetime] = _created()


class McpServer(Base):
    """A workspace's streamable HTTP MCP server, registered through the API (docs/mcp.md). Its
    headers are secrets: used by the workers' client, never returned."""

    __tablename__ = "mcp_servers"
    __table_args__ = (UniqueConstraint("workspace_id", "name"),)
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    workspace_id: Mapped[str] = mapped_column(ForeignKey("workspaces.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(32))
    url: Mapped[str] = mapped_column(String(2000))
    headers: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    timeout_ms: Mapped[int] = mapped_column(Integer, server_default="30000")
    created_at: Mapped[datetime] = _created()


class McpWorkerServer(Base):
    """A worker's own MCP server (its `mcpServers` file), published at start and on health
    changes: how the API knows a definition names a server some worker has."""

    __tablename__ = "mcp_worker_servers"
    worker_id: Mapped[str] = mapped_column(String(100), primary_key=True)
    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    transport: Mapped[str] = mapped_column(String(8))
    state: Mapped[str] = mapped_column(String(16))
    restarts: Mapped[int] = mapped_column(Integer, server_default="0")
    last_error: Mapped[str | None] = mapped_column(Text)
    server_version: Mapped[str | None] = mapped_column(String(200))
    updated_at: Mapped[datetime] = _created()


class McpToolPin(Base):
    """The tool list an MCP server gave a step at its first round (docs/mcp.md, "Pinned tool
    lists"): every later round, resume, retry and fork of the step offers exactly this list."""

    __tablename__ = "mcp_tool_pins"
    workflow_run_id: Mapped[str] = mapped_column(
        ForeignKey("workflow_runs.id", ondelete="CASCADE"), primary_key=True
    )
    step_name: Mapped[str] = mapped_column(String(100), primary_key=True)
    server: Mapped[str] = mapped_column(String(32), primary_key=True)
    tools: Mapped[list[Any]] = mapped_column(JSONB)  # [{name, description, inputSchema}]
    server_name: Mapped[str | None] = mapped_column(String(200))  # as the server said at initialize
    server_version: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = _created()


class Blob(Base):
    """An image or file of a conversation, stored once per workspace by the SHA-256 of its bytes;
    messages, checkpoints and tool traces name it by hash (docs/providers.md, "Images and files")."""

    __tablename__ = "blobs"
    workspace_id: Mapped[str] = mapped_column(
        ForeignKey("workspaces.id", ondelete="CASCADE"), primary_key=True
    )
    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    media_type: Mapped[str] = mapped_column(String(100))
    size_bytes: Mapped[int] = mapped_column(Integer)
    data: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = _created()


class McpBlob(Base):
    """Binary content of MCP results (images, audio, blobs), stored once by content hash; the
    trace's output names it by `sha256` instead of inlining it."""

    __tablename__ = "mcp_blobs"
    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    mime_type: Mapped[str] = mapped_column(String(200))
    data: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = _created()


THREAD_POLICIES = ("reject", "enqueue", "interrupt", "steer")
RUN_MESSAGE_STATUSES = ("pending", "injected", "discarded")


class Thread(Base):
    """A conversation with an agent definition; each turn is a run (docs/threads.md)."""

    __tablename__ = "threads"
    __table_args__ = (
        CheckConstraint(_in("on_active", THREAD_POLICIES), name="on_active"),
        Index("ix_threads_workspace_created", "workspace_id", "created_at"),
        Index(
            "ix_threads_metadata",
            "metadata",
            postgresql_using="gin",
            postgresql_ops={"metadata": "jsonb_path_ops"},
        ),
    )
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    workspace_id: Mapped[str] = mapped_column(ForeignKey("workspaces.id", ondelete="CASCADE"))
    definition_id: Mapped[str] = mapped_column(ForeignKey("workflow_definitions.id", ondelete="CASCADE"))
    # `metadata` is the declarative base's own attribute: the column keeps the name, not the attribute.
    thread_metadata: Mapped[dict[str, Any]] = mapped_column(
        "metadata", JSONB, server_default=text("'{}'::jsonb")
    )
    state: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    on_active: Mapped[str] = mapped_column(String(20), server_default="reject")
    # A fork (`forkOf`): the origin's turn whose conversation this thread's first turn continues.
    forked_from_run_id: Mapped[str | None] = mapped_column(String(40))
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = _created()


class RunMessage(Base):
    """A message sent to a running llm step (`steer`): pending until a round boundary takes it."""

    __tablename__ = "run_messages"
    __table_args__ = (
        CheckConstraint(_in("status", RUN_MESSAGE_STATUSES), name="status"),
        Index("ix_run_messages_run", "workflow_run_id", "created_at"),
        Index("ix_run_messages_pending", "workflow_run_id", postgresql_where=text("status = 'pending'")),
    )
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    workflow_run_id: Mapped[str] = mapped_column(ForeignKey("workflow_runs.id", ondelete="CASCADE"))
    content: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(20), server_default="pending")
    step_name: Mapped[str | None] = mapped_column(String(100))
    visit: Mapped[int | None] = mapped_column(Integer)
    round: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = _created()
    injected_at: Mapped[datetime | None] = _ts()


class StoreItem(Base):
    """The memory store: a workspace's JSON documents by namespace and key, with a generated
    full-text vector over their string values (docs/threads.md, "Memory store")."""

    __tablename__ = "store_items"
    __table_args__ = (Index("ix_store_items_search", "search", postgresql_using="gin"),)
    workspace_id: Mapped[str] = mapped_column(
        ForeignKey("workspaces.id", ondelete="CASCADE"), primary_key=True
    )
    namespace: Mapped[str] = mapped_column(Text, primary_key=True)
    key: Mapped[str] = mapped_column(Text, primary_key=True)
    value: Mapped[dict[str, Any]] = mapped_column(JSONB)
    search: Mapped[Any] = mapped_column(
        TSVECTOR,
        Computed("jsonb_to_tsvector('simple'::regconfig, value, '[\"string\"]'::jsonb)", persisted=True),
    )
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = _created()
