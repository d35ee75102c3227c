"""Budgets: workflow_definitions.budget (the default of its runs) and workflow_runs.budget

Revision ID: 0009
Revises: 0007
Create Date: 2026-11-26 10:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0009"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable, no default: existing definitions and runs have no budget (no limit), as before.
    op.add_column(
        "workflow_definitions", sa.Column("budget", postgresql.JSONB(astext_type=sa.Text()), nullable=True)
    )
    op.add_column(
        "workflow_runs", sa.Column("budget", postgresql.JSONB(astext_type=sa.Text()), nullable=True)
    )


def downgrade() -> None:
    op.drop_column("workflow_runs", "budget")
    op.drop_column("workflow_definitions", "budget")
