"""A map item's ending off the parent's lock: ended by the child's own statement, recorded on the
parent in batches

0027 counted each ending inside the child's COMMIT under the parent's row lock, so a map ended at
most one child per WAL flush. Now:

* The child's terminal statement ends its item. A trigger on `workflow_runs` (a `map` item's child
  run going COMPLETED or FAILED) runs `stevora_map_end_item` inside that statement: the item's
  result, its slot passed on to the next pending item (`FOR UPDATE SKIP LOCKED`, a PENDING child
  run), and the item marked `unrecorded`. No parent lock, no parent row written. A child cancelled
  on its own ends its item through the same function, called by the engine.
* `stevora_map_record(parent)`, one statement, called after the commit by the worker that ended
  the child (at most one in flight per parent per process), by the parent's due path and by the
  recovery sweep: under the parent's row lock it records every unrecorded ending of the parent's
  maps: counts, `MAP_ITEM_*` events (gapless sequence numbers), takes back a start the map no
  longer wants, makes the parent's wait due when the map is done; returns the runs to dispatch.

See docs/architecture.md ("map").

Revision ID: 0028
Revises: 0027
Create Date: 2026-11-27 12:30:00
"""

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op

revision: str = "0028"
down_revision: str | None = "0027"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

END_ITEM = """
CREATE FUNCTION stevora_map_end_item(p_child text, p_parent text, p_status text, p_output jsonb, p_error jsonb)
RETURNS TABLE (ended bigint, started_child text) LANGUAGE plpgsql AS $$
DECLARE
    v_step text;
    v_definition text;
    v_budget jsonb;
    v_workspace text;
    v_depth int;
    v_trace jsonb;
    v_index int;
    v_input jsonb;
    v_child text;
    v_ended bigint;
BEGIN
    -- The map that passes the slot on: the item's, when it is the current map of a WAITING parent
    -- and no failure stops it (a retried map shares a running child with the step run it retries:
    -- only the current one's slot is passed on). Step by step, each statement on its index: the
    -- next pending item is the first entry of the map's pending index, not a walk over the map.
    SELECT i.step_run_id, m.child_definition_id, m.child_budget, p.workspace_id, p.depth, p.trace_context
        INTO v_step, v_definition, v_budget, v_workspace, v_depth, v_trace
        FROM map_items i JOIN map_steps m ON m.step_run_id = i.step_run_id
        JOIN workflow_runs p ON p.id = m.workflow_run_id AND p.current_step_run_id = m.step_run_id
        WHERE i.child_run_id = p_child AND i.status = 'running' AND p.status = 'WAITING'
        AND NOT (m.on_item_failure = 'fail' AND (p_status <> 'completed' OR m.failed > 0))
        LIMIT 1;
    IF v_step IS NOT NULL THEN
        -- The first pending item no sibling's ending is starting.
        SELECT item_index, input INTO v_index, v_input FROM map_items
            WHERE step_run_id = v_step AND status = 'pending'
            ORDER BY item_index LIMIT 1 FOR UPDATE SKIP LOCKED;
        IF v_index IS NOT NULL THEN
            INSERT INTO workflow_runs (id, workspace_id, definition_id, status, input, idempotency_key,
                    dispatched_at, parent_run_id, depth, trace_context, budget)
                VALUES (stevora_new_id('wfrun'), v_workspace, v_definition, 'PENDING', v_input,
                    'map:' || v_step || ':' || v_index, now(), p_parent, v_depth + 1, v_trace, v_budget)
                ON CONFLICT (workspace_id, idempotency_key) DO NOTHING RETURNING id INTO v_child;
            IF v_child IS NOT NULL THEN
                UPDATE map_items SET status = 'running', child_run_id = v_child, started_at = now()
                    WHERE step_run_id = v_step AND item_index = v_index;
            END IF;
        END IF;
    END IF;
    UPDATE map_items SET status = p_status, output = p_output, error = p_error, ended_at = now(),
            unrecorded = true,
            passed_to = CASE WHEN step_run_id = v_step AND v_child IS NOT NULL THEN v_index END
        WHERE child_run_id = p_child AND status = 'running';
    GET DIAGNOSTICS v_ended = ROW_COUNT;
    RETURN QUERY SELECT v_ended, v_child;
END $$;
"""

CHILD_ENDED = """
CREATE FUNCTION stevora_map_child_ended() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_status text := lower(NEW.status);
    v_error jsonb;
BEGIN
    IF v_status <> 'completed' THEN  -- the run's error, with a code and message if it has none
        v_error := jsonb_build_object('code', 'CHILD_RUN_FAILED', 'message', '')
            || CASE WHEN jsonb_typeof(NEW.error) = 'object' THEN NEW.error ELSE '{}'::jsonb END;
    END IF;
    PERFORM stevora_map_end_item(NEW.id, NEW.parent_run_id, v_status,
        CASE WHEN v_status = 'completed' THEN NEW.output END, v_error);
    RETURN NULL;
END $$;
"""

RECORD = """
CREATE FUNCTION stevora_map_record(p_parent text) RETURNS text[] LANGUAGE plpgsql AS $$
DECLARE
    v_parent record;
    v_map record;
    v_item record;
    v_live boolean;
    v_running int;
    v_completed int;
    v_failed int;
    v_started text;
    v_dispatch text[] := '{}';
    v_types text[] := '{}';
    v_steps text[] := '{}';
    v_payloads jsonb[] := '{}';
    v_progress jsonb;
    v_n int;
    v_seq bigint;
    v_due boolean := false;
    v_locked boolean := false;
BEGIN
    -- The maps first, then the parent: the order a parent's cancellation takes (its children's
    -- items and maps, then the parent row), so the two never deadlock.
    FOR v_map IN SELECT m.step_run_id, m.step_name, m.total, m.running, m.completed, m.failed, m.on_item_failure
            FROM map_steps m WHERE m.step_run_id IN
                (SELECT DISTINCT i.step_run_id FROM map_items i WHERE i.workflow_run_id = p_parent AND i.unrecorded)
            ORDER BY m.step_run_id FOR NO KEY UPDATE OF m
    LOOP
        IF NOT v_locked THEN
            SELECT id, status, current_step_run_id INTO v_parent FROM workflow_runs
                WHERE id = p_parent FOR NO KEY UPDATE;
            v_locked := true;
        END IF;
        v_live := v_parent.status = 'WAITING' AND v_parent.current_step_run_id = v_map.step_run_id;
        v_running := v_map.running;
        v_completed := v_map.completed;
        v_failed := v_map.failed;
        FOR v_item IN WITH seen AS (UPDATE map_items SET unrecorded = false
                    WHERE workflow_run_id = p_parent AND unrecorded AND step_run_id = v_map.step_run_id
                    RETURNING item_index, child_run_id, status, error, passed_to, ended_at)
                SELECT * FROM seen ORDER BY ended_at, item_index
        LOOP
            v_running := v_running - 1;
            IF v_item.status = 'completed' THEN
                v_completed := v_completed + 1;
            ELSE
                v_failed := v_failed + 1;
            END IF;
            v_started := NULL;
            IF v_item.passed_to IS NOT NULL THEN
                SELECT child_run_id INTO v_started FROM map_items
                    WHERE step_run_id = v_map.step_run_id AND item_index = v_item.passed_to;
                IF NOT v_live OR (v_map.on_item_failure = 'fail' AND v_failed > 0) THEN
                    -- The parent stopped waiting on the map, or a failure stops it: the start is
                    -- taken back unless its child run is claimed (or being cancelled) already.
                    WITH gone AS (DELETE FROM workflow_runs w WHERE w.id IN (SELECT id FROM workflow_runs
                                WHERE id = v_started AND status = 'PENDING' FOR UPDATE SKIP LOCKED)
                            RETURNING w.id)
                    UPDATE map_items SET status = 'pending', child_run_id = NULL, started_at = NULL
                        WHERE step_run_id = v_map.step_run_id AND item_index = v_item.passed_to
                        AND child_run_id IN (SELECT id FROM gone);
                    IF FOUND THEN
                        v_started := NULL;
                    END IF;
                END IF;
                IF v_started IS NOT NULL THEN
                    v_running := v_running + 1;
                END IF;
            END IF;
            IF v_live THEN
                v_progress := jsonb_build_object('stepName', v_map.step_name, 'total', v_map.total,
                    'done', v_completed + v_failed, 'running', v_running, 'failed', v_failed);
                v_steps := v_steps || v_map.step_run_id::text;
                v_types := v_types || CASE WHEN v_item.status = 'completed' THEN 'MAP_ITEM_COMPLETED'
                    ELSE 'MAP_ITEM_FAILED' END;
                v_payloads := v_payloads || (jsonb_build_object('index', v_item.item_index,
                        'childRunId', v_item.child_run_id, 'status', upper(v_item.status))
                    || CASE WHEN v_item.error IS NULL THEN '{}'::jsonb
                        ELSE jsonb_build_object('error', v_item.error) END
                    || v_progress);
                IF v_started IS NOT NULL THEN
                    v_steps := v_steps || v_map.step_run_id::text;
                    v_types := v_types || 'MAP_ITEM_STARTED'::text;
                    v_payloads := v_payloads || (jsonb_build_object('index', v_item.passed_to,
                        'childRunId', v_started) || v_progress);
                    v_dispatch := v_dispatch || v_started;
                END IF;
            END IF;
        END LOOP;
        UPDATE map_steps SET running = v_running, completed = v_completed, failed = v_failed
            WHERE step_run_id = v_map.step_run_id;
        IF v_live AND (v_completed + v_failed = v_map.total OR (v_map.on_item_failure = 'fail' AND v_failed > 0))
        THEN
            UPDATE step_runs SET wait_until = now() WHERE id = v_map.step_run_id AND status = 'WAITING';
            v_due := true;
        END IF;
    END LOOP;
    v_n := coalesce(array_length(v_types, 1), 0);
    IF v_n = 0 AND NOT v_due THEN
        RETURN v_dispatch;
    END IF;
    UPDATE workflow_runs SET event_seq = event_seq + v_n, version = version + 1, updated_at = now(),
            next_run_at = CASE WHEN v_due THEN now() ELSE next_run_at END
        WHERE id = p_parent RETURNING event_seq INTO v_seq;
    INSERT INTO workflow_events (id, workflow_run_id, step_run_id, sequence, event_type, payload)
    SELECT stevora_new_id('evt'), p_parent, e.step_run_id, v_seq - v_n + e.k, e.event_type, e.payload
        FROM unnest(v_steps, v_types, v_payloads) WITH ORDINALITY AS e(step_run_id, event_type, payload, k);
    IF v_due THEN
        v_dispatch := v_dispatch || p_parent;
    END IF;
    RETURN v_dispatch;
END $$;
"""


def upgrade() -> None:
    op.execute("DROP TRIGGER map_item_ended ON map_items")
    op.execute("DROP FUNCTION stevora_map_item_ended()")
    # Existing rows were counted by 0027's trigger: false for them.
    op.add_column(
        "map_items", sa.Column("unrecorded", sa.Boolean(), server_default=sa.text("false"), nullable=False)
    )
    op.create_index(
        "ix_map_items_unrecorded",
        "map_items",
        ["workflow_run_id"],
        unique=False,
        postgresql_where=sa.text("unrecorded"),
    )
    op.execute(END_ITEM)
    op.execute(CHILD_ENDED)
    op.execute(RECORD)
    op.execute(
        "CREATE TRIGGER map_child_ended AFTER UPDATE OF status ON workflow_runs FOR EACH ROW "
        "WHEN (NEW.parent_run_id IS NOT NULL AND NEW.parent_tool_call_id IS NULL "
        "AND NEW.status IN ('COMPLETED', 'FAILED') AND OLD.status IS DISTINCT FROM NEW.status) "
        "EXECUTE FUNCTION stevora_map_child_ended()"
    )


def _revision_0027() -> ModuleType:
    path = Path(__file__).with_name("0027_map_item_endings.py")
    spec = importlib.util.spec_from_file_location("stevora_migration_0027", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def downgrade() -> None:
    m0027 = _revision_0027()
    op.execute("DROP TRIGGER map_child_ended ON workflow_runs")
    op.execute("DROP FUNCTION stevora_map_child_ended()")
    op.execute("DROP FUNCTION stevora_map_record(text)")
    op.execute("DROP FUNCTION stevora_map_end_item(text, text, text, jsonb, jsonb)")
    # Endings not yet recorded are counted now, as 0027 counted at the commit (their events are
    # not written: the timeline skips them and stays gapless; a done map is met by its re-check).
    op.execute(
        "UPDATE map_steps m SET running = m.running - c.n + c.passed, completed = m.completed + c.ok, "
        "failed = m.failed + c.n - c.ok FROM (SELECT step_run_id, count(*) AS n, "
        "count(*) FILTER (WHERE status = 'completed') AS ok, count(passed_to) AS passed "
        "FROM map_items WHERE unrecorded GROUP BY step_run_id) c WHERE m.step_run_id = c.step_run_id"
    )
    op.drop_index("ix_map_items_unrecorded", table_name="map_items", postgresql_where=sa.text("unrecorded"))
    op.drop_column("map_items", "unrecorded")
    op.execute(m0027.ITEM_ENDED)
    op.execute(
        "CREATE CONSTRAINT TRIGGER map_item_ended AFTER UPDATE OF status ON map_items "
        "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW "
        "WHEN (OLD.status = 'running' AND NEW.status IN ('completed', 'failed', 'cancelled')) "
        "EXECUTE FUNCTION stevora_map_item_ended()"
    )
