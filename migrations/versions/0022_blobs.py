"""Images and files of conversations, stored once per workspace by content hash (`blobs`)

An `llm` step's images and files (from its messages, its run's input, tool results and MCP image
content) are kept here once, keyed by (workspace, SHA-256 of the bytes); checkpoints, tool traces
and stored messages name them by hash only (docs/providers.md, "Images and files"). `mcp_blobs`
(0017) is not reused: it has no workspace, so the run page could not serve its rows by hash to one
workspace only without joining every trace that names them; MCP now writes its binary content
here too, and its old rows stay where they are for the traces that name them.

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-27 09:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "blobs",
        sa.Column("workspace_id", sa.String(length=40), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("media_type", sa.String(length=100), nullable=False),
        sa.Column("size_bytes", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name=op.f("fk_blobs_workspace_id_workspaces"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("workspace_id", "sha256", name=op.f("pk_blobs")),
    )


def downgrade() -> None:
    op.drop_table("blobs")
