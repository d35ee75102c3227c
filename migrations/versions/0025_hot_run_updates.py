"""Room for HOT updates of a run's row: `workflow_runs` and `step_runs` keep free space per page

Every checkpoint updates its run's row (event sequence, token and cost totals, state); none of
those columns is indexed, so PostgreSQL can write the new version beside the old one on the same
page (a heap-only tuple: no index entry in any of the table's ten indexes) — if the page has room.
Pages filled to 100 % by inserts had none: most updates went to another page and wrote one entry
per index (`python -m bench.real_path --db`, docs/benchmarks.md). A fill factor keeps room on
every page written from now on; rows already stored keep their pages until rewritten.

Revision ID: 0025
Revises: 0024
Create Date: 2026-11-27 09:40:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("ALTER TABLE workflow_runs SET (fillfactor = 50)")
    op.execute("ALTER TABLE step_runs SET (fillfactor = 70)")


def downgrade() -> None:
    op.execute("ALTER TABLE workflow_runs RESET (fillfactor)")
    op.execute("ALTER TABLE step_runs RESET (fillfactor)")
