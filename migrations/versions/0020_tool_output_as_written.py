"""Tool outputs kept as written: `tool_trace.output_json` becomes `json` (docs/long-horizon.md)

`jsonb` reorders an object's keys (shorter keys first) and rewrites numbers, so a tool result
rebuilt from it for a resumed, retried or forked round came back with other bytes than the round
first sent: the provider's prefix cache missed exactly after a crash. `json` keeps the text as
written, so the rebuilt transcript is byte for byte the one first sent. Nothing queries into
the column (no operator, index or equality on it), so it loses nothing by leaving `jsonb`.

Revision ID: 0020
Revises: 0018
Create Date: 2026-11-27 06:00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0020"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Rows written before this revision keep jsonb's order (what a resume after the upgrade sent
    # before it, too); new rows keep the handler's.
    op.execute("ALTER TABLE tool_trace ALTER COLUMN output_json TYPE json USING output_json::json")


def downgrade() -> None:
    op.execute("ALTER TABLE tool_trace ALTER COLUMN output_json TYPE jsonb USING output_json::jsonb")
