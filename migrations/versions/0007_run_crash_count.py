"""workflow_runs.crash_count: consecutive driver crashes and lease takeovers of a run

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-26 10:45:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A constant default: PostgreSQL adds the column without rewriting the table.
    op.add_column("workflow_runs", sa.Column("crash_count", sa.Integer(), server_default="0", nullable=False))


def downgrade() -> None:
    op.drop_column("workflow_runs", "crash_count")
