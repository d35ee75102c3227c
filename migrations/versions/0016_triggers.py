"""Triggers: schedules and their ticks, events, event triggers, debounce / batch groups, inbound
hooks (docs/triggers.md)

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-27 05:21:03.628156
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "workflow_definitions", sa.Column("schedule", postgresql.JSONB(astext_type=sa.Text()), nullable=True)
    )
    op.add_column(
        "workflow_definitions", sa.Column("triggers", postgresql.JSONB(astext_type=sa.Text()), nullable=True)
    )
    op.create_table(
        "inbound_hooks",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("workspace_id", sa.String(length=40), nullable=False),
        sa.Column("provider", sa.String(length=16), nullable=False),
        sa.Column("event", sa.String(length=200), nullable=True),
        sa.Column("secret", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint(
            "provider IN ('github', 'stripe', 'hmac')", name=op.f("ck_inbound_hooks_provider")
        ),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name=op.f("fk_inbound_hooks_workspace_id_workspaces"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_inbound_hooks")),
    )
    op.create_index(op.f("ix_inbound_hooks_workspace_id"), "inbound_hooks", ["workspace_id"], unique=False)
    op.create_table(
        "pending_triggers",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("workspace_id", sa.String(length=40), nullable=False),
        sa.Column("group_key", sa.Text(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("definition_id", sa.String(length=40), nullable=False),
        sa.Column("trigger_index", sa.Integer(), nullable=False),
        sa.Column(
            "event_ids",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'[]'::jsonb"),
            nullable=False,
        ),
        sa.Column("due_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("kind IN ('debounce', 'batch')", name=op.f("ck_pending_triggers_kind")),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name=op.f("fk_pending_triggers_workspace_id_workspaces"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pending_triggers")),
        sa.UniqueConstraint("group_key", name=op.f("uq_pending_triggers_group_key")),
    )
    op.create_index("ix_pending_triggers_due", "pending_triggers", ["due_at"], unique=False)
    op.create_table(
        "schedules",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("workspace_id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("definition_name", sa.String(length=200), nullable=False),
        sa.Column("definition_version", sa.String(length=50), nullable=False),
        sa.Column("source", sa.String(length=16), server_default="api", nullable=False),
        sa.Column("cron", sa.String(length=200), nullable=True),
        sa.Column("interval_s", sa.Integer(), nullable=True),
        sa.Column("timezone", sa.String(length=64), server_default="UTC", nullable=False),
        sa.Column(
            "input",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column("overlap", sa.String(length=16), server_default="skip", nullable=False),
        sa.Column("catchup_window_s", sa.Integer(), server_default="60", nullable=False),
        sa.Column("jitter_s", sa.Integer(), server_default="0", nullable=False),
        sa.Column("start_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("end_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("paused", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("next_fire_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("next_due_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("buffered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_run_id", sa.String(length=40), nullable=True),
        sa.Column("ticks_run", sa.Integer(), server_default="0", nullable=False),
        sa.Column("ticks_skipped", sa.Integer(), server_default="0", nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint(
            "overlap IN ('skip', 'buffer_one', 'allow', 'cancel_previous')", name=op.f("ck_schedules_overlap")
        ),
        sa.CheckConstraint(
            "(cron IS NULL) <> (interval_s IS NULL)", name=op.f("ck_schedules_cron_or_interval")
        ),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name=op.f("fk_schedules_workspace_id_workspaces"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_schedules")),
        sa.UniqueConstraint("workspace_id", "name", name="uq_schedule_name"),
    )
    op.create_index(
        "ix_schedules_due", "schedules", ["next_due_at"], unique=False, postgresql_where=sa.text("NOT paused")
    )
    op.create_table(
        "trigger_events",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("workspace_id", sa.String(length=40), nullable=False),
        sa.Column("event_key", sa.String(length=255), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("data", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("source", sa.String(length=60), server_default="api", nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("processed_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name=op.f("fk_trigger_events_workspace_id_workspaces"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_trigger_events")),
        sa.UniqueConstraint("workspace_id", "event_key", name="uq_trigger_event_key"),
    )
    op.create_index(
        "ix_trigger_events_workspace_received",
        "trigger_events",
        ["workspace_id", "received_at"],
        unique=False,
    )
    op.create_index(
        "ix_trigger_events_unprocessed",
        "trigger_events",
        ["received_at"],
        unique=False,
        postgresql_where=sa.text("processed_at IS NULL"),
    )
    op.create_table(
        "event_triggers",
        sa.Column("workspace_id", sa.String(length=40), nullable=False),
        sa.Column("definition_name", sa.String(length=200), nullable=False),
        sa.Column("trigger_index", sa.Integer(), nullable=False),
        sa.Column("definition_id", sa.String(length=40), nullable=False),
        sa.Column("event_name", sa.String(length=200), nullable=False),
        sa.Column("spec", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.ForeignKeyConstraint(
            ["definition_id"],
            ["workflow_definitions.id"],
            name=op.f("fk_event_triggers_definition_id_workflow_definitions"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name=op.f("fk_event_triggers_workspace_id_workspaces"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "workspace_id", "definition_name", "trigger_index", name=op.f("pk_event_triggers")
        ),
    )
    op.create_index("ix_event_triggers_event", "event_triggers", ["workspace_id", "event_name"], unique=False)
    op.create_table(
        "schedule_ticks",
        sa.Column("schedule_id", sa.String(length=40), nullable=False),
        sa.Column("scheduled_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("kind", sa.String(length=16), server_default="tick", nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(
            ["schedule_id"],
            ["schedules.id"],
            name=op.f("fk_schedule_ticks_schedule_id_schedules"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("schedule_id", "scheduled_at", name=op.f("pk_schedule_ticks")),
    )
    op.create_table(
        "trigger_event_runs",
        sa.Column("event_id", sa.String(length=40), nullable=False),
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("kind", sa.String(length=16), server_default="started", nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(
            ["event_id"],
            ["trigger_events.id"],
            name=op.f("fk_trigger_event_runs_event_id_trigger_events"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("event_id", "run_id", name=op.f("pk_trigger_event_runs")),
    )


def downgrade() -> None:
    op.drop_column("workflow_definitions", "triggers")
    op.drop_column("workflow_definitions", "schedule")
    op.drop_table("trigger_event_runs")
    op.drop_table("schedule_ticks")
    op.drop_index("ix_event_triggers_event", table_name="event_triggers")
    op.drop_table("event_triggers")
    op.drop_index("ix_trigger_events_unprocessed", table_name="trigger_events")
    op.drop_index("ix_trigger_events_workspace_received", table_name="trigger_events")
    op.drop_table("trigger_events")
    op.drop_index("ix_schedules_due", table_name="schedules", postgresql_where=sa.text("NOT paused"))
    op.drop_table("schedules")
    op.drop_index("ix_pending_triggers_due", table_name="pending_triggers")
    op.drop_table("pending_triggers")
    op.drop_index(op.f("ix_inbound_hooks_workspace_id"), table_name="inbound_hooks")
    op.drop_table("inbound_hooks")
