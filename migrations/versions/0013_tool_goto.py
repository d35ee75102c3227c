"""tool_trace.goto_step: the step a tool handler sent the run to (`ctx.goto`, docs/tool-calling.md)

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-26 13:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable, no default: PostgreSQL adds the column without rewriting the table.
    op.add_column("tool_trace", sa.Column("goto_step", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("tool_trace", "goto_step")
