"""Threads of runs, messages sent to running llm steps, and the memory store (docs/threads.md)

* `threads`: a conversation with one agent definition; each turn is a workflow run whose
  `thread_id` names it. The thread keeps the state carried from turn to turn and its default
  `on_active` policy; a fork names the turn whose conversation its first turn continues. Turns queue behind each other on the concurrency key `thread:<id>` (limit 1),
  so an enqueued message is a PENDING run, durable and in order.
* `run_messages`: messages sent to a running llm step (`steer`), pending until the step injects
  them at its next round boundary (then `injected`, with the step visit and round).
* `store_items`: per-workspace JSON documents under a namespace and a key, with a generated
  tsvector (GIN index) for PostgreSQL full-text search.

Revision ID: 0024
Revises: 0022
Create Date: 2026-11-27 09:30:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0024"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE threads (
            id varchar(40) CONSTRAINT pk_threads PRIMARY KEY,
            workspace_id varchar(40) NOT NULL
                CONSTRAINT fk_threads_workspace_id_workspaces REFERENCES workspaces(id) ON DELETE CASCADE,
            definition_id varchar(40) NOT NULL CONSTRAINT fk_threads_definition_id_workflow_definitions
                REFERENCES workflow_definitions(id) ON DELETE CASCADE,
            metadata jsonb NOT NULL DEFAULT '{}'::jsonb,
            state jsonb NOT NULL DEFAULT '{}'::jsonb,
            on_active varchar(20) NOT NULL DEFAULT 'reject'
                CONSTRAINT ck_threads_on_active CHECK (on_active IN ('reject', 'enqueue', 'interrupt', 'steer')),
            forked_from_run_id varchar(40),
            created_at timestamptz NOT NULL DEFAULT now(),
            updated_at timestamptz NOT NULL DEFAULT now()
        )
        """
    )
    op.execute("CREATE INDEX ix_threads_workspace_created ON threads (workspace_id, created_at)")
    op.execute("CREATE INDEX ix_threads_metadata ON threads USING gin (metadata jsonb_path_ops)")
    # No foreign key: a deleted thread leaves its turns' runs (and their traces) in place.
    op.execute("ALTER TABLE workflow_runs ADD COLUMN thread_id varchar(40)")
    op.execute(
        "CREATE INDEX ix_runs_thread_created ON workflow_runs (thread_id, created_at) WHERE thread_id IS NOT NULL"
    )
    op.execute(
        """
        CREATE TABLE run_messages (
            id varchar(40) CONSTRAINT pk_run_messages PRIMARY KEY,
            workflow_run_id varchar(40) NOT NULL CONSTRAINT fk_run_messages_workflow_run_id_workflow_runs
                REFERENCES workflow_runs(id) ON DELETE CASCADE,
            content text NOT NULL,
            status varchar(20) NOT NULL DEFAULT 'pending'
                CONSTRAINT ck_run_messages_status CHECK (status IN ('pending', 'injected', 'discarded')),
            step_name varchar(100),
            visit integer,
            round integer,
            created_at timestamptz NOT NULL DEFAULT now(),
            injected_at timestamptz
        )
        """
    )
    op.execute("CREATE INDEX ix_run_messages_run ON run_messages (workflow_run_id, created_at)")
    op.execute(
        "CREATE INDEX ix_run_messages_pending ON run_messages (workflow_run_id) WHERE status = 'pending'"
    )
    op.execute(
        """
        CREATE TABLE store_items (
            workspace_id varchar(40) NOT NULL
                CONSTRAINT fk_store_items_workspace_id_workspaces REFERENCES workspaces(id) ON DELETE CASCADE,
            namespace text NOT NULL,
            key text NOT NULL,
            value jsonb NOT NULL,
            search tsvector GENERATED ALWAYS AS (jsonb_to_tsvector('simple', value, '["string"]')) STORED,
            created_at timestamptz NOT NULL DEFAULT now(),
            updated_at timestamptz NOT NULL DEFAULT now(),
            CONSTRAINT pk_store_items PRIMARY KEY (workspace_id, namespace, key)
        )
        """
    )
    op.execute("CREATE INDEX ix_store_items_search ON store_items USING gin (search)")


def downgrade() -> None:
    op.execute("DROP TABLE store_items")
    op.execute("DROP TABLE run_messages")
    op.execute("DROP INDEX ix_runs_thread_created")
    op.execute("ALTER TABLE workflow_runs DROP COLUMN thread_id")
    op.execute("DROP TABLE threads")
