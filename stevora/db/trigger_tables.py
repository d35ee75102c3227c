"""Table models of triggers (docs/triggers.md): schedules and their ticks, events and the runs
they started, the definitions' event triggers, inbound webhook endpoints, and the pending
debounce / batch groups.

Kept beside `models.py` (same metadata) so the trigger tables have one home; `migrations/env.py`
imports this module so `alembic check` sees them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    Boolean,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from stevora.db.models import Base, _created, _in, _ts

OVERLAP_POLICIES = ("skip", "buffer_one", "allow", "cancel_previous")
HOOK_PROVIDERS = ("github", "stripe", "hmac")
PENDING_KINDS = ("debounce", "batch")


class Schedule(Base):
    """A schedule: which definition, when (cron or interval), and what to do with late or
    overlapping ticks. `next_fire_at` is the next tick not yet handled; `next_due_at` is that
    tick plus its jitter, what the workers' due pass looks at."""

    __tablename__ = "schedules"
    __table_args__ = (
        CheckConstraint(_in("overlap", OVERLAP_POLICIES), name="overlap"),
        CheckConstraint("(cron IS NULL) <> (interval_s IS NULL)", name="cron_or_interval"),
        UniqueConstraint("workspace_id", "name", name="uq_schedule_name"),
        Index("ix_schedules_due", "next_due_at", postgresql_where=text("NOT paused")),
    )
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    workspace_id: Mapped[str] = mapped_column(ForeignKey("workspaces.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(200))
    definition_name: Mapped[str] = mapped_column(String(200))
    definition_version: Mapped[str] = mapped_column(String(50))  # a version, or "latest"
    # "api", or "definition" when a definition's `schedule` keeps it (replaced on each new version)
    source: Mapped[str] = mapped_column(String(16), server_default="api")
    cron: Mapped[str | None] = mapped_column(String(200))
    interval_s: Mapped[int | None] = mapped_column(Integer)
    timezone: Mapped[str] = mapped_column(String(64), server_default="UTC")
    input: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    overlap: Mapped[str] = mapped_column(String(16), server_default="skip")
    catchup_window_s: Mapped[int] = mapped_column(Integer, server_default="60")
    jitter_s: Mapped[int] = mapped_column(Integer, server_default="0")
    start_at: Mapped[datetime | None] = _ts()
    end_at: Mapped[datetime | None] = _ts()
    paused: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    next_fire_at: Mapped[datetime | None] = _ts()
    next_due_at: Mapped[datetime | None] = _ts()
    buffered_at: Mapped[datetime | None] = _ts()  # buffer_one: the one tick waiting for its turn
    last_run_id: Mapped[str | None] = mapped_column(String(40))
    ticks_run: Mapped[int] = mapped_column(Integer, server_default="0")
    ticks_skipped: Mapped[int] = mapped_column(Integer, server_default="0")
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = _created()


class ScheduleTick(Base):
    """A run a schedule started, under the tick it carries (`scheduled_at`)."""

    __tablename__ = "schedule_ticks"
    schedule_id: Mapped[str] = mapped_column(ForeignKey("schedules.id", ondelete="CASCADE"), primary_key=True)
    scheduled_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(40))
    kind: Mapped[str] = mapped_column(String(16), server_default="tick")  # tick | manual | backfill
    created_at: Mapped[datetime] = _created()


class TriggerEvent(Base):
    """An event received (`POST /v1/events` or an inbound webhook). `event_key` is its id, given or
    generated: unique per workspace, so a repeated id is the same event. Stored (committed) first,
    then processed once: its runs and `processed_at` commit together."""

    __tablename__ = "trigger_events"
    __table_args__ = (
        UniqueConstraint("workspace_id", "event_key", name="uq_trigger_event_key"),
        Index("ix_trigger_events_workspace_received", "workspace_id", "received_at"),
        Index("ix_trigger_events_unprocessed", "received_at", postgresql_where=text("processed_at IS NULL")),
    )
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    workspace_id: Mapped[str] = mapped_column(ForeignKey("workspaces.id", ondelete="CASCADE"))
    event_key: Mapped[str] = mapped_column(String(255))
    name: Mapped[str] = mapped_column(String(200))
    data: Mapped[Any] = mapped_column(JSONB)
    ts: Mapped[datetime] = _ts(nullable=False)
    source: Mapped[str] = mapped_column(String(60), server_default="api")
    received_at: Mapped[datetime] = _created()
    # Set in the transaction that started its runs; NULL: not yet (the workers' pass finishes it).
    processed_at: Mapped[datetime | None] = _ts()


class TriggerEventRun(Base):
    """A run an event started (or answered: `kind` = "resumed" for a waiting step)."""

    __tablename__ = "trigger_event_runs"
    event_id: Mapped[str] = mapped_column(
        ForeignKey("trigger_events.id", ondelete="CASCADE"), primary_key=True
    )
    run_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), server_default="started")
    created_at: Mapped[datetime] = _created()


class EventTrigger(Base):
    """A definition's `triggers` entry, for the latest version of each definition name: replaced
    whenever a new version is stored, so the newest version alone says what events start it."""

    __tablename__ = "event_triggers"
    __table_args__ = (Index("ix_event_triggers_event", "workspace_id", "event_name"),)
    workspace_id: Mapped[str] = mapped_column(
        ForeignKey("workspaces.id", ondelete="CASCADE"), primary_key=True
    )
    definition_name: Mapped[str] = mapped_column(String(200), primary_key=True)
    trigger_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    definition_id: Mapped[str] = mapped_column(ForeignKey("workflow_definitions.id", ondelete="CASCADE"))
    event_name: Mapped[str] = mapped_column(String(200))
    spec: Mapped[dict[str, Any]] = mapped_column(JSONB)


class PendingTrigger(Base):
    """A debounce or batch group collecting events until it fires (the workers' due pass)."""

    __tablename__ = "pending_triggers"
    __table_args__ = (
        CheckConstraint(_in("kind", PENDING_KINDS), name="kind"),
        Index("ix_pending_triggers_due", "due_at"),
    )
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    workspace_id: Mapped[str] = mapped_column(ForeignKey("workspaces.id", ondelete="CASCADE"))
    # definition name, trigger index and (debounce) key value: one open group per group_key
    group_key: Mapped[str] = mapped_column(Text, unique=True)
    kind: Mapped[str] = mapped_column(String(16))
    definition_id: Mapped[str] = mapped_column(String(40))
    trigger_index: Mapped[int] = mapped_column(Integer)
    event_ids: Mapped[list[Any]] = mapped_column(JSONB, server_default=text("'[]'::jsonb"))
    due_at: Mapped[datetime] = _ts(nullable=False)
    created_at: Mapped[datetime] = _created()


class InboundHook(Base):
    """An inbound webhook endpoint (`/hooks/{id}`). The secret is an HMAC key, needed in clear to
    verify signatures; it is shown once at creation and never returned again."""

    __tablename__ = "inbound_hooks"
    __table_args__ = (CheckConstraint(_in("provider", HOOK_PROVIDERS), name="provider"),)
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    workspace_id: Mapped[str] = mapped_column(ForeignKey("workspaces.id", ondelete="CASCADE"), index=True)
    provider: Mapped[str] = mapped_column(String(16))
    event: Mapped[str | None] = mapped_column(String(200))
    secret: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = _created()
