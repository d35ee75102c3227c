"""Time travel: the state-change log, forks and replays

* `step_runs.state_updates`, `tool_trace.state_updates`: the shallow state change each step
  completion and each tool `update_state` made, written in the statement that makes it, so the
  state at any fork point is the run's initial state with these merged in order (one delta per
  row: the per-round storage stays constant).
* `workflow_runs.initial_state`: the state a run started from (a fork starts from the state at
  its fork point; NULL is `{}`), `forked_from_run_id` / `forked_at_step` / `forked_at_round`,
  `replay_of` and `replay_tools` (how a replay's tool calls are answered).
* `inherited_from` on `step_runs`, `llm_calls`, `tool_trace`: the origin row a fork's copy stands
  for (NULL: executed by this run).

Revision ID: 0011
Revises: 0009
Create Date: 2026-11-26 11:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0011"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _jsonb() -> postgresql.JSONB:
    return postgresql.JSONB(astext_type=sa.Text())


def upgrade() -> None:
    op.add_column("step_runs", sa.Column("state_updates", _jsonb(), nullable=True))
    op.add_column("step_runs", sa.Column("inherited_from", sa.String(40), nullable=True))
    op.add_column("tool_trace", sa.Column("state_updates", _jsonb(), nullable=True))
    op.add_column("tool_trace", sa.Column("inherited_from", sa.String(40), nullable=True))
    op.add_column("llm_calls", sa.Column("inherited_from", sa.String(40), nullable=True))
    op.add_column("workflow_runs", sa.Column("initial_state", _jsonb(), nullable=True))
    op.add_column("workflow_runs", sa.Column("forked_from_run_id", sa.String(40), nullable=True))
    op.add_column("workflow_runs", sa.Column("forked_at_step", sa.String(100), nullable=True))
    op.add_column("workflow_runs", sa.Column("forked_at_round", sa.Integer(), nullable=True))
    op.add_column("workflow_runs", sa.Column("fork_edits", _jsonb(), nullable=True))
    op.add_column("workflow_runs", sa.Column("replay_of", sa.String(40), nullable=True))
    op.add_column("workflow_runs", sa.Column("replay_tools", sa.String(16), nullable=True))
    op.create_index(
        "ix_workflow_runs_forked_from_run_id",
        "workflow_runs",
        ["forked_from_run_id"],
        postgresql_where=sa.text("forked_from_run_id IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_workflow_runs_forked_from_run_id", table_name="workflow_runs")
    for column in (
        "replay_tools",
        "replay_of",
        "fork_edits",
        "forked_at_round",
        "forked_at_step",
        "forked_from_run_id",
        "initial_state",
    ):
        op.drop_column("workflow_runs", column)
    op.drop_column("llm_calls", "inherited_from")
    op.drop_column("tool_trace", "inherited_from")
    op.drop_column("tool_trace", "state_updates")
    op.drop_column("step_runs", "inherited_from")
    op.drop_column("step_runs", "state_updates")
