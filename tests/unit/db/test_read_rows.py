"""The typed rows of `stevora.db.reads` stay equal to the tables they read: a row declaring its
`table` has every column of it, in the model's types, and nothing else."""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import pkgutil
import typing
from typing import Any

import pytest

import stevora.db.reads
from stevora.db.models import Base
from stevora.db.reads.rows import Row


def _rows() -> list[type[Row]]:
    found: list[type[Row]] = []
    for info in pkgutil.iter_modules(stevora.db.reads.__path__):
        module = importlib.import_module(f"stevora.db.reads.{info.name}")
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, Row) and "table" in vars(value):
                found.append(value)
    return found


TABLE_ROWS = _rows()


def test_every_table_read_has_a_row() -> None:
    assert {r.table for r in TABLE_ROWS} >= {"workflow_runs", "step_runs", "llm_calls", "tool_trace"}


@pytest.mark.parametrize("row", TABLE_ROWS, ids=lambda r: r.__name__)
def test_a_table_row_has_the_columns_of_its_table(row: type[Row]) -> None:
    table = Base.metadata.tables[row.table]
    model = next(m.class_ for m in Base.registry.mappers if m.local_table is table)
    model_types = typing.get_type_hints(model)
    row_types = typing.get_type_hints(row)
    assert list(row.names()) == [c.name for c in table.c]
    for name in row.names():
        (expected,) = typing.get_args(model_types[name])  # Mapped[X]
        assert row_types[name] == expected, name


def test_a_row_is_frozen_and_a_read_only_mapping() -> None:
    from stevora.db.reads.events import EventRow

    now = datetime.datetime.now(datetime.UTC)
    event = EventRow("evt_1", "wfrun_1", None, 1, "WORKFLOW_STARTED", {"a": 1}, now)
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.sequence = 2  # type: ignore[misc]
    assert event["sequence"] == 1 and dict(event)["payload"] == {"a": 1}
    with pytest.raises(KeyError):
        event["as_dict"]
    merged: dict[str, Any] = {**event, "extra": True}
    assert merged["event_type"] == "WORKFLOW_STARTED" and len(event) == 7
