"""Leaner trace rows: no per-row foreign key to the step run or model call, two indexes fewer

Each round of the tool loop inserts an `llm_calls` row and a `tool_trace` row. Their foreign keys
to `step_runs` and `llm_calls` had PostgreSQL check, per inserted row, that the parent exists and
key-share-lock it (a tuple lock: the parent's page dirtied and a WAL record written, every round)
and `ix_tool_trace_step_run_id` wrote one more index entry per tool call; the index served only
those keys' ON DELETE CASCADE (no query reads tool_trace by step run alone). `workflow_events`
kept two indexes per event: its primary key on `id`, which no query looks up (ids are generated,
unique by construction), and the unique (run, sequence) that every reader pages by. The latter is
now the primary key: one index entry per event (two per round) fewer. The table's index is
rebuilt once by this migration.

Nothing deletes a step run or a model call by itself: they go with their run (retention, a
workspace's deletion), and `llm_calls` and `tool_trace` have their own cascading foreign key to
`workflow_runs` (served by `ix_llm_calls_run` / `ix_tool_trace_run`), which stays. The rows are
only ever written by the checkpoint statement, joined on the run row it has just updated under
its lease, with the step run the worker created for that run. (The step-run cascade into
`llm_calls` had no usable index at all: its only index on step_run_id is partial.) Measured with
`python -m bench.real_path --db` (docs/benchmarks.md).

Revision ID: 0026
Revises: 0025
Create Date: 2026-11-27 10:20:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0026"
down_revision: str | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# (table, constraint, column, referred table) of the dropped foreign keys.
_KEYS = (
    ("llm_calls", "fk_llm_calls_step_run_id_step_runs", "step_run_id", "step_runs"),
    ("tool_trace", "fk_tool_trace_step_run_id_step_runs", "step_run_id", "step_runs"),
    ("tool_trace", "fk_tool_trace_llm_call_id_llm_calls", "llm_call_id", "llm_calls"),
)


def upgrade() -> None:
    for table, name, _, _ in _KEYS:
        op.drop_constraint(name, table, type_="foreignkey")
    op.drop_index("ix_tool_trace_step_run_id", table_name="tool_trace")
    # Events: the (run, sequence) unique index becomes the primary key; the index on `id` goes.
    op.execute(
        "ALTER TABLE workflow_events DROP CONSTRAINT pk_workflow_events, DROP CONSTRAINT uq_event_sequence, "
        "ADD CONSTRAINT pk_workflow_events PRIMARY KEY (workflow_run_id, sequence)"
    )


def downgrade() -> None:
    op.execute(
        "ALTER TABLE workflow_events DROP CONSTRAINT pk_workflow_events, "
        "ADD CONSTRAINT pk_workflow_events PRIMARY KEY (id), "
        "ADD CONSTRAINT uq_event_sequence UNIQUE (workflow_run_id, sequence)"
    )
    op.create_index("ix_tool_trace_step_run_id", "tool_trace", ["step_run_id"], unique=False)
    for table, name, column, referred in _KEYS:
        op.create_foreign_key(name, table, referred, [column], ["id"], ondelete="CASCADE")
