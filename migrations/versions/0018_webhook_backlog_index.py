"""Pending deliveries by webhook: the backlog cap counts them on every announcement (docs/api/webhooks.md)

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-27 06:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Partial: the count stops at the cap and never reads a webhook's delivered or failed history.
    op.create_index(
        "ix_deliveries_pending_by_webhook",
        "webhook_deliveries",
        ["webhook_id"],
        unique=False,
        postgresql_where=sa.text("status = 'PENDING'"),
    )


def downgrade() -> None:
    op.drop_index("ix_deliveries_pending_by_webhook", table_name="webhook_deliveries")
