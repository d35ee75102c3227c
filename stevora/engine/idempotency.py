"""An `Idempotency-Key` answers one kind of request: the run it made is returned only to a request
of the same kind (a new run, a fork of run X, a replay of run X); any other is a 409 (docs/api/)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stevora.errors import ConflictError

NEW_RUN = "a new run"


def fork_kind(origin_id: str, *, replay: bool) -> str:
    return f"a {'replay' if replay else 'fork'} of run {origin_id}"


def kind_of(row: Mapping[str, Any]) -> str:
    """What request made `row` (a run with its fork columns)."""
    if row["replay_of"] is not None:
        return fork_kind(row["replay_of"], replay=True)
    if row["forked_from_run_id"] is not None:
        return fork_kind(row["forked_from_run_id"], replay=False)
    return NEW_RUN


def check_same_kind(row: Mapping[str, Any], wanted: str, key: str) -> None:
    """Raise a 409 when the run `key` already made is not what this request asks for."""
    made = kind_of(row)
    if made != wanted:
        raise ConflictError(
            f"Idempotency-Key '{key}' was used for {made} ({row['id']}); this request asks for "
            f"{wanted}. A key answers one kind of request: send a new key.",
            details={"idempotencyKey": key, "existingRunId": row["id"], "usedFor": made, "requested": wanted},
        )
