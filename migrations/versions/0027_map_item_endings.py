"""A map item's ending counted at its commit: siblings' endings no longer hold the parent's lock
across a round trip

A child run's ending ends its item (`map_items.status` leaves `running`) and passes its slot on to
the next pending item (`passed_to`) in its own statement, waiting for no sibling. What needs the
parent's row lock (the map's counts, the progress events and their sequence numbers on the
parent, making the parent's wait due) is done by a deferred trigger, which PostgreSQL runs inside
COMMIT: the lock is held from there to the end of the commit, never while the client, a busy
worker process, gets round to sending COMMIT. See docs/architecture.md ("map").

Also a partial index of pending items: finding the next item to start was a walk past every item
already started (O(n²) row visits over a map of n items).

Revision ID: 0027
Revises: 0026
Create Date: 2026-11-27 10:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0027"
down_revision: str | None = "0026"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# An id in the shape of stevora.ids.new_id: prefix, 9 base-36 chars of the millisecond clock, 12
# random base-36 chars (from gen_random_uuid's random bytes).
NEW_ID = """
CREATE FUNCTION stevora_new_id(prefix text) RETURNS text LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    digits constant text := '0123456789abcdefghijklmnopqrstuvwxyz';
    ms bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    stamp text := '';
    tail text := '';
    noise bytea := uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid());
    b int;
    i int := 0;
BEGIN
    FOR k IN 1..9 LOOP
        stamp := substr(digits, (ms % 36)::int + 1, 1) || stamp;
        ms := ms / 36;
    END LOOP;
    WHILE length(tail) < 12 LOOP
        b := get_byte(noise, i);
        i := i + 1;
        IF b < 252 THEN  -- 7 * 36: no modulo bias
            tail := tail || substr(digits, b % 36 + 1, 1);
        END IF;
    END LOOP;
    RETURN prefix || '_' || stamp || tail;
END $$;
"""

ITEM_ENDED = """
CREATE FUNCTION stevora_map_item_ended() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_parent record;
    v_map record;
    v_live boolean;
    v_keep boolean;
    v_failed int := (NEW.status <> 'completed')::int;
    v_started text;
    v_done boolean;
    v_count int;
    v_seq bigint;
    v_progress jsonb;
BEGIN
    -- The parent's lock first (the house order: child, then parent), then the map's.
    SELECT id, status, current_step_run_id INTO v_parent FROM workflow_runs
        WHERE id = NEW.workflow_run_id FOR NO KEY UPDATE;
    v_live := v_parent.status = 'WAITING' AND v_parent.current_step_run_id = NEW.step_run_id;
    SELECT on_item_failure, failed INTO v_map FROM map_steps
        WHERE step_run_id = NEW.step_run_id FOR NO KEY UPDATE;
    IF NEW.passed_to IS NOT NULL THEN
        v_keep := v_live AND NOT (v_map.on_item_failure = 'fail' AND v_map.failed > 0);
        IF v_keep THEN
            SELECT child_run_id INTO v_started FROM map_items
                WHERE step_run_id = NEW.step_run_id AND item_index = NEW.passed_to;
        ELSE
            -- The parent stopped waiting on the map (cancelled, failed, retried), or a sibling's
            -- failure counted first stops it: the start is taken back, never dispatched.
            WITH gone AS (
                DELETE FROM workflow_runs w USING map_items i
                WHERE i.step_run_id = NEW.step_run_id AND i.item_index = NEW.passed_to
                    AND w.id = i.child_run_id AND w.status = 'PENDING' RETURNING w.id)
            UPDATE map_items SET status = 'pending', child_run_id = NULL, started_at = NULL
                WHERE step_run_id = NEW.step_run_id AND item_index = NEW.passed_to
                    AND child_run_id IN (SELECT id FROM gone);
        END IF;
    END IF;
    UPDATE map_steps SET running = running - 1 + (v_started IS NOT NULL)::int,
            completed = completed + 1 - v_failed, failed = failed + v_failed
        WHERE step_run_id = NEW.step_run_id
        RETURNING step_name, total, running, completed, failed, on_item_failure INTO v_map;
    IF NOT v_live THEN
        RETURN NULL;  -- counted only: nobody waits on this map any more
    END IF;
    v_done := v_map.completed + v_map.failed = v_map.total
        OR (v_map.on_item_failure = 'fail' AND v_map.failed > 0);
    v_count := 1 + (v_started IS NOT NULL)::int;
    UPDATE workflow_runs SET event_seq = event_seq + v_count, version = version + 1, updated_at = now(),
            next_run_at = CASE WHEN v_done THEN now() ELSE next_run_at END
        WHERE id = v_parent.id RETURNING event_seq INTO v_seq;
    v_progress := jsonb_build_object('stepName', v_map.step_name, 'total', v_map.total,
        'done', v_map.completed + v_map.failed, 'running', v_map.running, 'failed', v_map.failed);
    INSERT INTO workflow_events (id, workflow_run_id, step_run_id, sequence, event_type, payload)
    VALUES (stevora_new_id('evt'), v_parent.id, NEW.step_run_id, v_seq - v_count + 1,
        CASE WHEN NEW.status = 'completed' THEN 'MAP_ITEM_COMPLETED' ELSE 'MAP_ITEM_FAILED' END,
        jsonb_build_object('index', NEW.item_index, 'childRunId', NEW.child_run_id, 'status', upper(NEW.status))
            || CASE WHEN NEW.error IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('error', NEW.error) END
            || v_progress);
    IF v_started IS NOT NULL THEN
        INSERT INTO workflow_events (id, workflow_run_id, step_run_id, sequence, event_type, payload)
        VALUES (stevora_new_id('evt'), v_parent.id, NEW.step_run_id, v_seq, 'MAP_ITEM_STARTED',
            jsonb_build_object('index', NEW.passed_to, 'childRunId', v_started) || v_progress);
    END IF;
    IF v_done THEN
        UPDATE step_runs SET wait_until = now() WHERE id = NEW.step_run_id AND status = 'WAITING';
    END IF;
    RETURN NULL;
END $$;
"""


def upgrade() -> None:
    op.add_column("map_items", sa.Column("passed_to", sa.Integer(), nullable=True))
    op.create_index(
        "ix_map_items_pending",
        "map_items",
        ["step_run_id", "item_index"],
        unique=False,
        postgresql_where=sa.text("status = 'pending'"),
    )
    op.execute(NEW_ID)
    op.execute(ITEM_ENDED)
    op.execute(
        "CREATE CONSTRAINT TRIGGER map_item_ended AFTER UPDATE OF status ON map_items "
        "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW "
        "WHEN (OLD.status = 'running' AND NEW.status IN ('completed', 'failed', 'cancelled')) "
        "EXECUTE FUNCTION stevora_map_item_ended()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER map_item_ended ON map_items")
    op.execute("DROP FUNCTION stevora_map_item_ended()")
    op.execute("DROP FUNCTION stevora_new_id(text)")
    op.drop_index(
        "ix_map_items_pending", table_name="map_items", postgresql_where=sa.text("status = 'pending'")
    )
    op.drop_column("map_items", "passed_to")
