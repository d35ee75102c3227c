"""A run's trace rows go with it through one trigger, not a foreign key checked per inserted row

`workflow_events`, `llm_calls` and `tool_trace` referenced `workflow_runs` with `ON DELETE
CASCADE`. PostgreSQL checks such a key for every inserted row: an after-row trigger that runs
`SELECT 1 FROM workflow_runs WHERE id = $1 FOR KEY SHARE` through SPI at the end of the statement
(about a tenth of PostgreSQL's CPU per tool round, two rows per checkpoint, profiled with perf:
docs/benchmarks.md) and locks the run row again (a WAL record), although every one of those rows
is written with its run in hand: by a statement or transaction that has just updated (so locked)
that run row (the checkpoints, the claim, the transitions, commands taking the event sequence from
it, answers to awaited tool calls), or in the transaction that created the run (forks and replays
copying their inherited rows). A delete of the run waits for that lock, then deletes the rows.

The keys go; what they did on delete stays: a statement-level `AFTER DELETE` trigger on
`workflow_runs` deletes the events, model calls and tool traces of the deleted runs (the runs of
a retention batch, of a workspace's deletion, child runs cascading with their parent), in the
same statement as the delete, as the cascade did. Nothing else deletes from these tables.

Revision ID: 0029
Revises: 0028
Create Date: 2026-11-27 12:30:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0029"
down_revision: str | None = "0028"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# (table, foreign key) of the keys replaced by the trigger.
_KEYS = (
    ("workflow_events", "fk_workflow_events_workflow_run_id_workflow_runs"),
    ("llm_calls", "fk_llm_calls_workflow_run_id_workflow_runs"),
    ("tool_trace", "fk_tool_trace_workflow_run_id_workflow_runs"),
)

_FUNCTION = """
CREATE FUNCTION stevora_delete_run_trace() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM workflow_events e USING deleted_runs d WHERE e.workflow_run_id = d.id;
    DELETE FROM tool_trace t USING deleted_runs d WHERE t.workflow_run_id = d.id;
    DELETE FROM llm_calls c USING deleted_runs d WHERE c.workflow_run_id = d.id;
    RETURN NULL;
END
$$
"""
_TRIGGER = """
CREATE TRIGGER trg_workflow_runs_delete_trace AFTER DELETE ON workflow_runs
REFERENCING OLD TABLE AS deleted_runs FOR EACH STATEMENT EXECUTE FUNCTION stevora_delete_run_trace()
"""


def upgrade() -> None:
    op.execute(_FUNCTION)
    op.execute(_TRIGGER)
    for table, name in _KEYS:
        op.drop_constraint(name, table, type_="foreignkey")


def downgrade() -> None:
    # Rows whose run is gone cannot exist (the trigger deleted them with it); the keys come back.
    for table, name in _KEYS:
        op.create_foreign_key(name, table, "workflow_runs", ["workflow_run_id"], ["id"], ondelete="CASCADE")
    op.execute("DROP TRIGGER trg_workflow_runs_delete_trace ON workflow_runs")
    op.execute("DROP FUNCTION stevora_delete_run_trace()")
