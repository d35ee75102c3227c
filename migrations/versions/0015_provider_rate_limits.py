"""Provider rate limits shared by every worker (docs/flow-control.md, "Provider rate limits")

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-26 13:15:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # UNLOGGED: a bucket is soft state (lost in a crash, it comes back full, like the provider's
    # after a quiet minute); its updates then commit without waiting for a WAL flush, which is most
    # of a logged update's cost (docs/flow-control.md, "Provider rate limits").
    op.create_table(
        "provider_rate_limits",
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("requests", sa.Float(), nullable=False),
        sa.Column("tokens", sa.Float(), nullable=False),
        sa.Column("scale", sa.Float(), server_default=sa.text("1"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_provider_rate_limits")),
        prefixes=["UNLOGGED"],
    )


def downgrade() -> None:
    op.drop_table("provider_rate_limits")
