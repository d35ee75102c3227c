"""llm_calls.time_to_first_token_ms: streamed calls' time to the first content or tool-call delta

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24 23:50:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable: calls that did not stream (and every call recorded before this) have none.
    op.add_column("llm_calls", sa.Column("time_to_first_token_ms", sa.Float(), nullable=True))


def downgrade() -> None:
    op.drop_column("llm_calls", "time_to_first_token_ms")
