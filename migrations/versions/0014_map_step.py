"""The `map` step: its fan-out (map_steps) and its items (map_items)

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-26 13:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "map_steps",
        sa.Column("step_run_id", sa.String(length=40), nullable=False),
        sa.Column("workflow_run_id", sa.String(length=40), nullable=False),
        sa.Column("step_name", sa.String(length=100), nullable=False),
        sa.Column("child_definition_id", sa.String(length=40), nullable=False),
        sa.Column("child_budget", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column("on_item_failure", sa.String(length=16), nullable=False),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column("running", sa.Integer(), server_default="0", nullable=False),
        sa.Column("completed", sa.Integer(), server_default="0", nullable=False),
        sa.Column("failed", sa.Integer(), server_default="0", nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint(
            "on_item_failure IN ('fail', 'continue')", name=op.f("ck_map_steps_on_item_failure")
        ),
        sa.ForeignKeyConstraint(
            ["step_run_id"],
            ["step_runs.id"],
            name=op.f("fk_map_steps_step_run_id_step_runs"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["workflow_run_id"],
            ["workflow_runs.id"],
            name=op.f("fk_map_steps_workflow_run_id_workflow_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("step_run_id", name=op.f("pk_map_steps")),
    )
    op.create_index("ix_map_steps_run_step", "map_steps", ["workflow_run_id", "step_name"], unique=False)
    op.create_table(
        "map_items",
        sa.Column("step_run_id", sa.String(length=40), nullable=False),
        sa.Column("item_index", sa.Integer(), nullable=False),
        sa.Column("workflow_run_id", sa.String(length=40), nullable=False),
        sa.Column("input", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("status", sa.String(length=16), server_default="pending", nullable=False),
        sa.Column("child_run_id", sa.String(length=40), nullable=True),
        sa.Column("output", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("error", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('pending', 'running', 'completed', 'failed', 'cancelled')",
            name=op.f("ck_map_items_status"),
        ),
        sa.ForeignKeyConstraint(
            ["step_run_id"],
            ["step_runs.id"],
            name=op.f("fk_map_items_step_run_id_step_runs"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["workflow_run_id"],
            ["workflow_runs.id"],
            name=op.f("fk_map_items_workflow_run_id_workflow_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("step_run_id", "item_index", name=op.f("pk_map_items")),
    )
    op.create_index(
        "ix_map_items_child",
        "map_items",
        ["child_run_id"],
        unique=False,
        postgresql_where=sa.text("child_run_id IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index(
        "ix_map_items_child", table_name="map_items", postgresql_where=sa.text("child_run_id IS NOT NULL")
    )
    op.drop_table("map_items")
    op.drop_index("ix_map_steps_run_step", table_name="map_steps")
    op.drop_table("map_steps")
