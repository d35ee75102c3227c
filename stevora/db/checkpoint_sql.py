"""The checkpoint statements, generated from one column list per table (see `checkpoints.py`).

Each checkpoint is one data-modifying CTE over an input relation `i` of one row per run:
(1) `UPDATE workflow_runs ... FROM i` bumps the event sequence of the runs whose lease the row's
owner still holds (`lease_owner = i.owner AND status = 'RUNNING'`), (2) inserts the trace rows
joined on the runs it bumped, (3) inserts their events, and returns per run its event's commit
timestamp and whether messages sent to the run wait for its llm step (`pending_messages`: the
step looks for them only when this says so, docs/threads.md). A row whose fence fails is not
written and is missing from the result: only that caller gets LeaseLost.

A batch returns the runs (2) and (3) were joined on, `r` itself, with `now()`: every trace row and
event of the statement gets that `created_at` (the column's default, the transaction's start), and
every run of `r` gets its trace row and its event or the statement fails (neither insert skips a
row: a conflict is an error). It does not join the inserts' `RETURNING` back on `i` and `r`: the
planner, which expects one row from a CTE, joined them in nested loops, O(rows²) per statement
(~1,000 comparisons for 32 runs, ~12,000 for 110).

Each comes in two shapes generated from the same column list: one row with its parameters in
place (a lone checkpoint: the statement the single-row path always sent) or a batch, whose rows
arrive as one JSON array of objects read by `jsonb_to_recordset` (a group commit batch). One JSON
document, not one array per column: the driver encodes it in one call, where arrays made it
inspect every element of every column in Python (`isinstance` against `collections.abc`, about
25 calls per row). The document is jsonb: PostgreSQL parses it once and takes each jsonb column's
value from it as it is. JSON null is SQL NULL for every column type; jsonb columns carry the
value itself (a string stays a JSON string); a `json` column (kept as written) carries its JSON
text as a string, which the statement casts back, so it stores the bytes the per-column encoder
wrote. Adding a column to a trace table is one line below.
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
    ("reasoning_tokens", "int"),
    ("cost_usd", "float8"),
    ("duration_ms", "float8"),
    ("time_to_first_token_ms", "float8"),
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
    # `json`, not `jsonb`: the result as written, so a rebuilt transcript sends the same bytes.
    ("output_json", "json"),
    ("status", "text"),
    ("error", "text"),
    ("error_code", "text"),
    ("result_text", "text"),
    ("duration_ms", "float8"),
    ("idempotency_key", "text"),
    ("child_run_id", "text"),
    # The call's `update_state`, also merged into the run below: the state-change log that fork
    # points are recovered from (docs/time-travel.md).
    ("state_updates", "jsonb"),
    # The step the call's handler went to (`ctx.goto`), in the checkpoint that records its result.
    ("goto_step", "text"),
)


def pending_messages(run: str) -> str:
    """Whether messages sent to the run `run` (a row alias) wait for its llm step (`run_messages`,
    pending: docs/threads.md, "Steering"), as a column. Returned by every checkpoint and by the
    statements that start an execution, so the step queries `run_messages` only when this says
    so: a probe of a partial index inside a statement made anyway, instead of a round trip per
    model call. It sees what committed before its statement began; a message committed later is
    seen by the next checkpoint."""
    return (
        f"EXISTS (SELECT 1 FROM run_messages m WHERE m.workflow_run_id = {run}.id "
        "AND m.status = 'pending') AS pending_messages"
    )


_RUN_COLUMNS = (("run_id", "text"), ("owner", "text"))
_EVENT_COLUMNS = (("event_id", "text"), ("event_type", "text"), ("payload", "jsonb"))

# What each checkpoint adds to its run besides the event sequence ({col}: the row's value).
_LLM_RUN_SET = """,
           total_cost_cents = w.total_cost_cents + {cost_usd} * 100,
           total_input_tokens = w.total_input_tokens + {input_tokens},
           total_output_tokens = w.total_output_tokens + {output_tokens}"""
# A tool's `ctx.update_state(...)` lands in the same statement as its trace row: never twice,
# never for a call that is not recorded as completed.
_TOOL_RUN_SET = """,
           state = CASE WHEN {state_updates} IS NULL THEN w.state
                        ELSE COALESCE(w.state, '{{}}'::jsonb) || {state_updates} END"""

# One row: parameters in place (the shape the single-row statement always had).
_SINGLE = """WITH r AS (
    UPDATE workflow_runs w
       SET event_seq = w.event_seq + 1{run_set}
     WHERE w.id = {run_id} AND w.lease_owner = {owner} AND w.status = 'RUNNING'
 RETURNING w.id, w.event_seq, {pending}
), c AS (
    INSERT INTO {table} ({table_columns})
    SELECT {values} FROM r
    RETURNING id
), e AS (
    INSERT INTO workflow_events (id, workflow_run_id, step_run_id, sequence, event_type, payload)
    SELECT {event_id}, {run_id}, {step_run_id}, r.event_seq, {event_type}, {payload} FROM r, c
    RETURNING created_at
)
SELECT r.id AS workflow_run_id, e.created_at, r.pending_messages FROM e, r
"""

# A batch: `i` is one row per run, from one JSON array of objects keyed by input name.
_BATCH = """WITH i AS (
    SELECT * FROM jsonb_to_recordset($1::jsonb) AS i({columns})
), r AS (
    UPDATE workflow_runs w
       SET event_seq = w.event_seq + 1{run_set}
      FROM i
     WHERE w.id = i.run_id AND w.lease_owner = i.owner AND w.status = 'RUNNING'
 RETURNING w.id, w.event_seq, {pending}
), c AS (
    INSERT INTO {table} ({table_columns})
    SELECT {values} FROM i JOIN r ON r.id = i.run_id
), e AS (
    INSERT INTO workflow_events (id, workflow_run_id, step_run_id, sequence, event_type, payload)
    SELECT i.event_id, i.run_id, i.step_run_id, r.event_seq, i.event_type, i.payload
      FROM i JOIN r ON r.id = i.run_id
)
SELECT r.id AS workflow_run_id, now() AS created_at, r.pending_messages FROM r
"""


@dataclass(frozen=True, slots=True, eq=False)
class CheckpointKind:
    """One kind of checkpoint: its statement in both shapes and how a row's values are laid out.
    Compared and hashed by identity (there are two, and the group committer keys its queues by
    them on every checkpoint)."""

    name: str
    single_sql: str  # one row, parameters in place
    batch_sql: str  # jsonb_to_recordset($1) of one object per row, keyed by `names`
    record_values: attrgetter[Any]  # record -> its table columns' values, in column order
    names: tuple[str, ...]  # the statement's inputs, in `row()` order
    # Inputs of type `json` (kept as written): a batch carries each as its JSON text, a string
    # (see `_kind`), so `encode_batch` encodes them first.
    json_text: tuple[int, ...] = ()

    def row(self, run_id: str, owner: str, rec: Any, event: tuple[Any, ...], *extra: Any) -> tuple[Any, ...]:
        """The statement's parameters for one checkpoint: run, record columns, event, extras."""
        return (run_id, owner, *self.record_values(rec), *event, *extra)


def _kind(
    name: str,
    table: str,
    columns: tuple[tuple[str, str], ...],
    run_set: str,
    extra: tuple[tuple[str, str], ...] = (),
) -> CheckpointKind:
    inputs = (*_RUN_COLUMNS, *columns, *_EVENT_COLUMNS, *extra)
    table_columns = ", ".join(["workflow_run_id", *(c for c, _ in columns)])

    def render(template: str, ref: dict[str, str], **more: str) -> str:
        values = ", ".join([ref["run_id"], *(ref[c] for c, _ in columns)])
        return template.format(
            run_set=run_set.format(**ref),
            table=table,
            table_columns=table_columns,
            values=values,
            pending=pending_messages("w"),
            **ref,
            **more,
        )

    params = {c: f"${n}::{t}" for n, (c, t) in enumerate(inputs, 1)}
    # The batch document is jsonb: PostgreSQL parses it once, and a jsonb column's value is
    # taken from it as it is (json_to_recordset over a json document lexed the text once to
    # validate it, once to split it, and once more per jsonb value). A `json` column keeps its
    # value as written (jsonb would reorder its keys), so the document carries that as a string,
    # its JSON text, cast back to json: the bytes the single-row statement stores.
    batch_ref = {c: f"i.{c}::json" if t == "json" else f"i.{c}" for c, t in inputs}
    batch_columns = ", ".join(f"{c} {'text' if t == 'json' else t}" for c, t in inputs)
    batch = render(_BATCH, batch_ref, columns=batch_columns)
    return CheckpointKind(
        name,
        render(_SINGLE, params),
        batch,
        attrgetter(*(c for c, _ in columns)),
        tuple(c for c, _ in inputs),
        tuple(n for n, (_, t) in enumerate(inputs) if t == "json"),
    )


LLM_CALL = _kind("llm_call", "llm_calls", LLM_CALL_COLUMNS, _LLM_RUN_SET)
TOOL_TRACE = _kind("tool_trace", "tool_trace", TOOL_TRACE_COLUMNS, _TOOL_RUN_SET)

# Both kinds in one statement: model calls ($1) and tool calls ($2) of different runs, when both
# are queued (the group committer's usual case at concurrency: the runs whose model call has
# just committed run their tools while the others' tool results are written). One statement and
# one commit instead of two. One UPDATE bumps every run, in run id order (as each kind's batch
# locks its rows, and the heartbeat its); each kind's run columns are added from its own
# document (the other's are NULL there: sums add 0, the state is kept).
_PAIR = """WITH a AS (
    SELECT * FROM jsonb_to_recordset($1::jsonb) AS i({a_columns})
), b AS (
    SELECT * FROM jsonb_to_recordset($2::jsonb) AS i({b_columns})
), r AS (
    UPDATE workflow_runs w
       SET event_seq = w.event_seq + 1{run_set}
      FROM (SELECT run_id, owner FROM a UNION ALL SELECT run_id, owner FROM b ORDER BY run_id) i
      LEFT JOIN a ON a.run_id = i.run_id LEFT JOIN b ON b.run_id = i.run_id
     WHERE w.id = i.run_id AND w.lease_owner = i.owner AND w.status = 'RUNNING'
 RETURNING w.id, w.event_seq, {pending}
), ca AS (
    INSERT INTO {a_table} ({a_table_columns})
    SELECT {a_values} FROM a i JOIN r ON r.id = i.run_id
), cb AS (
    INSERT INTO {b_table} ({b_table_columns})
    SELECT {b_values} FROM b i JOIN r ON r.id = i.run_id
), e AS (
    INSERT INTO workflow_events (id, workflow_run_id, step_run_id, sequence, event_type, payload)
    SELECT i.event_id, i.run_id, i.step_run_id, r.event_seq, i.event_type, i.payload
      FROM a i JOIN r ON r.id = i.run_id
    UNION ALL
    SELECT i.event_id, i.run_id, i.step_run_id, r.event_seq, i.event_type, i.payload
      FROM b i JOIN r ON r.id = i.run_id
)
SELECT r.id AS workflow_run_id, now() AS created_at, r.pending_messages FROM r
"""


def _pair_sql() -> str:
    def side(columns: tuple[tuple[str, str], ...]) -> tuple[str, str, str]:
        inputs = (*_RUN_COLUMNS, *columns, *_EVENT_COLUMNS)
        doc = ", ".join(f"{c} {'text' if t == 'json' else t}" for c, t in inputs)
        table_columns = ", ".join(["workflow_run_id", *(c for c, _ in columns)])
        values = ", ".join(["i.run_id", *(f"i.{c}::json" if t == "json" else f"i.{c}" for c, t in columns)])
        return doc, table_columns, values

    a_doc, a_table_columns, a_values = side(LLM_CALL_COLUMNS)
    b_doc, b_table_columns, b_values = side(TOOL_TRACE_COLUMNS)
    # The model call's sums from `a` (NULL for a tool call's run: adds 0), the tool call's state
    # from `b` (NULL for a model call's run: the state as it is).
    llm_ref = {c: f"COALESCE(a.{c}, 0)" for c, t in LLM_CALL_COLUMNS if t in ("int", "float8")}
    tool_ref = {c: f"b.{c}" for c, _ in TOOL_TRACE_COLUMNS}
    return _PAIR.format(
        a_columns=a_doc,
        b_columns=b_doc,
        run_set=_LLM_RUN_SET.format(**llm_ref) + _TOOL_RUN_SET.format(**tool_ref),
        pending=pending_messages("w"),
        a_table="llm_calls",
        a_table_columns=a_table_columns,
        a_values=a_values,
        b_table="tool_trace",
        b_table_columns=b_table_columns,
        b_values=b_values,
    )


# The statement `GroupCommitter` sends for a batch of model calls ($1) and one of tool calls ($2),
# each a document as its kind's batch takes it.
PAIR_SQL = _pair_sql()
