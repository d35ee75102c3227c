"""awaited tool calls: client-executed tools and workflows as tools

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-24 21:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("workflow_definitions", sa.Column("input_schema", postgresql.JSONB(), nullable=True))
    op.add_column("workflow_definitions", sa.Column("default_params", sa.Text(), nullable=True))
    op.add_column("workflow_runs", sa.Column("parent_run_id", sa.String(length=40), nullable=True))
    op.add_column("workflow_runs", sa.Column("parent_tool_call_id", sa.String(length=200), nullable=True))
    op.add_column("workflow_runs", sa.Column("depth", sa.Integer(), server_default="1", nullable=False))
    op.create_foreign_key(
        op.f("fk_workflow_runs_parent_run_id_workflow_runs"),
        "workflow_runs",
        "workflow_runs",
        ["parent_run_id"],
        ["id"],
        ondelete="CASCADE",
    )
    op.create_index(
        "ix_runs_parent",
        "workflow_runs",
        ["parent_run_id"],
        unique=False,
        postgresql_where=sa.text("parent_run_id IS NOT NULL"),
    )
    op.add_column("tool_trace", sa.Column("child_run_id", sa.String(length=40), nullable=True))
    op.create_table(
        "awaited_tool_calls",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("workflow_run_id", sa.String(length=40), nullable=False),
        sa.Column("step_run_id", sa.String(length=40), nullable=False),
        sa.Column("llm_call_id", sa.String(length=40), nullable=False),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("sequence", sa.Integer(), nullable=False),
        sa.Column("tool_call_id", sa.String(length=200), nullable=False),
        sa.Column("tool_name", sa.String(length=64), nullable=False),
        sa.Column("arguments", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), server_default="pending", nullable=False),
        sa.Column("deadline_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("child_run_id", sa.String(length=40), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("answered_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("kind IN ('client', 'workflow')", name=op.f("ck_awaited_tool_calls_kind")),
        sa.CheckConstraint("status IN ('pending', 'answered')", name=op.f("ck_awaited_tool_calls_status")),
        sa.ForeignKeyConstraint(
            ["llm_call_id"],
            ["llm_calls.id"],
            name=op.f("fk_awaited_tool_calls_llm_call_id_llm_calls"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["step_run_id"],
            ["step_runs.id"],
            name=op.f("fk_awaited_tool_calls_step_run_id_step_runs"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["workflow_run_id"],
            ["workflow_runs.id"],
            name=op.f("fk_awaited_tool_calls_workflow_run_id_workflow_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_awaited_tool_calls")),
        sa.UniqueConstraint("llm_call_id", "sequence", name="uq_awaited_tool_call"),
    )
    op.create_index(
        "ix_awaited_pending",
        "awaited_tool_calls",
        ["workflow_run_id"],
        unique=False,
        postgresql_where=sa.text("status = 'pending'"),
    )
    op.create_index(
        "ix_awaited_child",
        "awaited_tool_calls",
        ["child_run_id"],
        unique=False,
        postgresql_where=sa.text("child_run_id IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_awaited_child", table_name="awaited_tool_calls")
    op.drop_index("ix_awaited_pending", table_name="awaited_tool_calls")
    op.drop_table("awaited_tool_calls")
    op.drop_column("tool_trace", "child_run_id")
    op.drop_index("ix_runs_parent", table_name="workflow_runs")
    op.drop_constraint(
        op.f("fk_workflow_runs_parent_run_id_workflow_runs"), "workflow_runs", type_="foreignkey"
    )
    op.drop_column("workflow_runs", "depth")
    op.drop_column("workflow_runs", "parent_tool_call_id")
    op.drop_column("workflow_runs", "parent_run_id")
    op.drop_column("workflow_definitions", "default_params")
    op.drop_column("workflow_definitions", "input_schema")
