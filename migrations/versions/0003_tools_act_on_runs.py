"""tools that act on the run: tool steps, approval-gated tool calls

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24 21:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.alter_column("tool_trace", "llm_call_id", existing_type=sa.String(length=40), nullable=True)
    op.create_index(
        "uq_tool_trace_tool_step",
        "tool_trace",
        ["step_run_id"],
        unique=True,
        postgresql_where=sa.text("llm_call_id IS NULL"),
    )
    op.alter_column("awaited_tool_calls", "llm_call_id", existing_type=sa.String(length=40), nullable=True)
    op.add_column(
        "awaited_tool_calls", sa.Column("parameters", postgresql.JSONB(astext_type=sa.Text()), nullable=True)
    )
    op.add_column(
        "awaited_tool_calls",
        sa.Column("approved_arguments", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    )
    op.drop_constraint(op.f("ck_awaited_tool_calls_kind"), "awaited_tool_calls", type_="check")
    op.create_check_constraint(
        op.f("ck_awaited_tool_calls_kind"), "awaited_tool_calls", "kind IN ('client', 'workflow', 'approval')"
    )
    op.drop_constraint(op.f("ck_awaited_tool_calls_status"), "awaited_tool_calls", type_="check")
    op.create_check_constraint(
        op.f("ck_awaited_tool_calls_status"),
        "awaited_tool_calls",
        "status IN ('pending', 'approved', 'answered')",
    )
    op.create_index(
        "uq_awaited_tool_step",
        "awaited_tool_calls",
        ["step_run_id"],
        unique=True,
        postgresql_where=sa.text("llm_call_id IS NULL"),
    )
    op.drop_constraint(op.f("uq_approval_requests_step_run_id"), "approval_requests", type_="unique")
    op.create_index(
        op.f("ix_approval_requests_step_run_id"), "approval_requests", ["step_run_id"], unique=False
    )
    op.add_column("approval_requests", sa.Column("awaited_tool_call_id", sa.String(length=40), nullable=True))
    op.create_unique_constraint(
        op.f("uq_approval_requests_awaited_tool_call_id"), "approval_requests", ["awaited_tool_call_id"]
    )


def downgrade() -> None:
    op.drop_constraint(op.f("uq_approval_requests_awaited_tool_call_id"), "approval_requests", type_="unique")
    op.drop_column("approval_requests", "awaited_tool_call_id")
    op.drop_index(op.f("ix_approval_requests_step_run_id"), table_name="approval_requests")
    op.create_unique_constraint(
        op.f("uq_approval_requests_step_run_id"), "approval_requests", ["step_run_id"]
    )
    op.drop_index("uq_awaited_tool_step", table_name="awaited_tool_calls")
    op.drop_constraint(op.f("ck_awaited_tool_calls_status"), "awaited_tool_calls", type_="check")
    op.create_check_constraint(
        op.f("ck_awaited_tool_calls_status"), "awaited_tool_calls", "status IN ('pending', 'answered')"
    )
    op.drop_constraint(op.f("ck_awaited_tool_calls_kind"), "awaited_tool_calls", type_="check")
    op.create_check_constraint(
        op.f("ck_awaited_tool_calls_kind"), "awaited_tool_calls", "kind IN ('client', 'workflow')"
    )
    op.drop_column("awaited_tool_calls", "approved_arguments")
    op.drop_column("awaited_tool_calls", "parameters")
    op.alter_column("awaited_tool_calls", "llm_call_id", existing_type=sa.String(length=40), nullable=False)
    op.drop_index("uq_tool_trace_tool_step", table_name="tool_trace")
    op.alter_column("tool_trace", "llm_call_id", existing_type=sa.String(length=40), nullable=False)
