"""The checkpoint statements, generated from one column list per table (see `checkpoints.py`).

Each checkpoint is one data-modifying CTE over an input relation `i` of one row per run:
(1) `UPDATE workflow_runs ... FROM i` bumps the event sequence of the runs whose lease the row's
owner still holds (`lease_owner = i.owner AND status = 'RUNNING'`), (2) inserts the trace rows
joined on the runs it bumped, (3) inserts their events. A row whose fence fails is not written
and is missing from the result: only that caller gets LeaseLost.

`i` comes in two shapes with the same columns: one row of scalar parameters (a lone checkpoint:
the statement costs what the single-row statement always did) or `unnest(...)` over one array per
column (a group commit batch). Adding a column to a trace table is one line in its list below.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from typing import Any

# (column, PostgreSQL type) of the trace table, in the order of the record's attributes of the
# same names (`LlmCallRecord`, `ToolTraceRecord`); `workflow_run_id` comes from the run.
LLM_CALL_COLUMNS: tuple[tuple[str, str], ...] = (
    ("id", "text"),
    ("step_run_id", "text"),
    ("step_name", "text"),
    ("round", "int"),
    ("provider", "text"),
    ("model", "text"),
    ("status", "text"),
    ("request", "jsonb"),
    ("response", "jsonb"),
    ("error", "jsonb"),
    ("finish_reason", "text"),
    ("input_tokens", "int"),
    ("output_tokens", "int"),
    ("cache_read_tokens", "int"),
    ("cache_write_tokens", "int"),
    ("cost_usd", "float8"),
    ("duration_ms", "float8"),
)

TOOL_TRACE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("id", "text"),
    ("step_run_id", "text"),
    ("llm_call_id", "text"),
    ("round", "int"),
    ("sequence", "int"),
    ("tool_call_id", "text"),
    ("tool_name", "text"),
    ("input_json", "jsonb"),
    ("output_json", "jsonb"),
    ("status", "text"),
    ("error", "text"),
    ("error_code", "text"),
    ("result_text", "text"),
    ("duration_ms", "float8"),
    ("idempotency_key", "text"),
    ("child_run_id", "text"),
)

_RUN_COLUMNS = (("run_id", "text"), ("owner", "text"))
_EVENT_COLUMNS = (("event_id", "text"), ("event_type", "text"), ("payload", "jsonb"))

# What each checkpoint adds to its run besides the event sequence.
_LLM_RUN_SET = """,
           total_cost_cents = w.total_cost_cents + i.cost_usd * 100,
           total_input_tokens = w.total_input_tokens + i.input_tokens,
           total_output_tokens = w.total_output_tokens + i.output_tokens"""
# A tool's `ctx.update_state(...)` lands in the same statement as its trace row: never twice,
# never for a call that is not recorded as completed.
_TOOL_RUN_SET = """,
           state = CASE WHEN i.state_updates IS NULL THEN w.state
                        ELSE COALESCE(w.state, '{}'::jsonb) || i.state_updates END"""


@dataclass(frozen=True, slots=True)
class CheckpointKind:
    """One kind of checkpoint: its statement in both shapes and how a row's values are laid out."""

    name: str
    single_sql: str  # `i` is one row of scalar parameters
    batch_sql: str  # `i` is unnest(...) of one array per column
    record_values: attrgetter[Any]  # record -> its table columns' values, in column order

    def row(self, run_id: str, owner: str, rec: Any, event: tuple[Any, ...], *extra: Any) -> tuple[Any, ...]:
        """The statement's parameters for one checkpoint: run, record columns, event, extras."""
        return (run_id, owner, *self.record_values(rec), *event, *extra)


def _kind(
    name: str,
    table: str,
    columns: tuple[tuple[str, str], ...],
    run_set: str,
    extra: tuple[tuple[str, str], ...],
) -> CheckpointKind:
    inputs = (*_RUN_COLUMNS, *columns, *_EVENT_COLUMNS, *extra)
    names = ", ".join(c for c, _ in inputs)
    single = "SELECT " + ", ".join(f"${n}::{t} AS {c}" for n, (c, t) in enumerate(inputs, 1))
    batch = f"SELECT * FROM unnest({', '.join(f'${n}::{t}[]' for n, (_, t) in enumerate(inputs, 1))}) AS i({names})"
    table_columns = ", ".join(["workflow_run_id", *(c for c, _ in columns)])
    values = ", ".join(["i.run_id", *(f"i.{c}" for c, _ in columns)])
    body = f"""), r AS (
    UPDATE workflow_runs w
       SET event_seq = w.event_seq + 1{run_set}
      FROM i
     WHERE w.id = i.run_id AND w.lease_owner = i.owner AND w.status = 'RUNNING'
 RETURNING w.id, w.event_seq
), c AS (
    INSERT INTO {table} ({table_columns})
    SELECT {values} FROM i JOIN r ON r.id = i.run_id
    RETURNING id
)
INSERT INTO workflow_events (id, workflow_run_id, step_run_id, sequence, event_type, payload)
SELECT i.event_id, i.run_id, i.step_run_id, r.event_seq, i.event_type, i.payload
  FROM i JOIN r ON r.id = i.run_id JOIN c ON c.id = i.id
RETURNING workflow_run_id, created_at
"""
    getter = attrgetter(*(c for c, _ in columns))
    return CheckpointKind(name, f"WITH i AS ({single}{body}", f"WITH i AS ({batch}{body}", getter)


LLM_CALL = _kind("llm_call", "llm_calls", LLM_CALL_COLUMNS, _LLM_RUN_SET, ())
TOOL_TRACE = _kind(
    "tool_trace", "tool_trace", TOOL_TRACE_COLUMNS, _TOOL_RUN_SET, (("state_updates", "jsonb"),)
)
