"""Flow control: concurrency keys, workspace-wide limit, priorities (docs/flow-control.md)

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-26 11:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A definition's defaults for its runs; NULL: none (no key, priority 0), as before.
    op.add_column(
        "workflow_definitions",
        sa.Column("concurrency", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    )
    op.add_column("workflow_definitions", sa.Column("priority", sa.Integer(), nullable=True))
    op.add_column("workflow_runs", sa.Column("concurrency_key", sa.Text(), nullable=True))
    op.add_column("workflow_runs", sa.Column("concurrency_limit", sa.Integer(), nullable=True))
    op.add_column(
        "workflow_runs",
        sa.Column("concurrency_hold_waiting", sa.Boolean(), server_default=sa.text("true"), nullable=False),
    )
    op.add_column("workflow_runs", sa.Column("workspace_limit", sa.Integer(), nullable=True))
    op.add_column("workflow_runs", sa.Column("priority", sa.Integer(), server_default="0", nullable=False))
    op.add_column("workflow_runs", sa.Column("queued_at", sa.DateTime(timezone=True), nullable=True))
    # The slot count of a key (and its queue) is read under the key's advisory lock at every
    # claim of a keyed run and every ending: one index scan each.
    op.create_index(
        "ix_runs_concurrency_key",
        "workflow_runs",
        ["workspace_id", "concurrency_key", "status"],
        postgresql_where=sa.text(
            "concurrency_key IS NOT NULL AND status IN ('PENDING', 'RUNNING', 'WAITING', 'PAUSED')"
        ),
    )
    # Pending runs of a raised priority: what a claim looks for before taking a run of lower.
    op.create_index(
        "ix_runs_pending_priority",
        "workflow_runs",
        ["priority", "created_at"],
        postgresql_where=sa.text("status = 'PENDING' AND priority > 0"),
    )


def downgrade() -> None:
    op.drop_index("ix_runs_pending_priority", table_name="workflow_runs")
    op.drop_index("ix_runs_concurrency_key", table_name="workflow_runs")
    for column in (
        "queued_at",
        "priority",
        "workspace_limit",
        "concurrency_hold_waiting",
        "concurrency_limit",
        "concurrency_key",
    ):
        op.drop_column("workflow_runs", column)
    op.drop_column("workflow_definitions", "priority")
    op.drop_column("workflow_definitions", "concurrency")
