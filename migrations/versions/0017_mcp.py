"""MCP servers, pinned tool lists and stored binary results (docs/mcp.md)

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-27 05:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _created() -> sa.Column:  # type: ignore[type-arg]
    return sa.Column(
        "created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
    )


def upgrade() -> None:
    op.create_table(
        "mcp_servers",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("workspace_id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=32), nullable=False),
        sa.Column("url", sa.String(length=2000), nullable=False),
        sa.Column("headers", postgresql.JSONB(), server_default=sa.text("'{}'::jsonb"), nullable=False),
        sa.Column("timeout_ms", sa.Integer(), server_default="30000", nullable=False),
        _created(),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name=op.f("fk_mcp_servers_workspace_id_workspaces"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_mcp_servers")),
        sa.UniqueConstraint("workspace_id", "name", name=op.f("uq_mcp_servers_workspace_id")),
    )
    op.create_table(
        "mcp_worker_servers",
        sa.Column("worker_id", sa.String(length=100), nullable=False),
        sa.Column("name", sa.String(length=32), nullable=False),
        sa.Column("transport", sa.String(length=8), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("restarts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("server_version", sa.String(length=200), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("worker_id", "name", name=op.f("pk_mcp_worker_servers")),
    )
    op.create_table(
        "mcp_tool_pins",
        sa.Column("workflow_run_id", sa.String(length=40), nullable=False),
        sa.Column("step_name", sa.String(length=100), nullable=False),
        sa.Column("server", sa.String(length=32), nullable=False),
        sa.Column("tools", postgresql.JSONB(), nullable=False),
        sa.Column("server_name", sa.String(length=200), nullable=True),
        sa.Column("server_version", sa.String(length=200), nullable=True),
        _created(),
        sa.ForeignKeyConstraint(
            ["workflow_run_id"],
            ["workflow_runs.id"],
            name=op.f("fk_mcp_tool_pins_workflow_run_id_workflow_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("workflow_run_id", "step_name", "server", name=op.f("pk_mcp_tool_pins")),
    )
    op.create_table(
        "mcp_blobs",
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("mime_type", sa.String(length=200), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        _created(),
        sa.PrimaryKeyConstraint("sha256", name=op.f("pk_mcp_blobs")),
    )


def downgrade() -> None:
    op.drop_table("mcp_blobs")
    op.drop_table("mcp_tool_pins")
    op.drop_table("mcp_worker_servers")
    op.drop_table("mcp_servers")
