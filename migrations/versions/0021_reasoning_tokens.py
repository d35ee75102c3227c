"""Reasoning and thinking tokens on model calls: `llm_calls.reasoning_tokens` (docs/providers.md)

A part of `output_tokens` (priced with them): OpenAI's `reasoning_tokens`, Anthropic's thinking
tokens. The reasoning items and thinking blocks themselves are kept in the call's `response`
(`reasoning`: each item's JSON text as a string, which jsonb keeps byte for byte).

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-27 09:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "llm_calls", sa.Column("reasoning_tokens", sa.Integer(), server_default="0", nullable=False)
    )


def downgrade() -> None:
    op.drop_column("llm_calls", "reasoning_tokens")
