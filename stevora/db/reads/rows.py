"""The base of the typed, frozen rows the read modules return, and how they run a read.

A read module lists a row's columns from its fields (`Row.columns`), so a statement selects exactly
what the row holds, in field order; the driver's records end here, in `stevora.db`. Every read on
the pool goes through the one retry policy (`stevora.db.transient.retry_transient`): a lost
connection is tried again with backoff for `READ_RETRY_BUDGET_S`, then the error goes up (the
API's 503 handler, the UI's error page). A read on a caller's connection is part of the caller's
transaction, which the caller retries if it wants to.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any, ClassVar, Self, TypeAlias, TypeVar

import asyncpg

from stevora.db.transient import retry_transient

Reader: TypeAlias = asyncpg.Pool | asyncpg.Connection

T = TypeVar("T")

# A person or a client waits on a read: a lost connection is retried (the pool replaces it) for a
# short while, then the API answers 503 with Retry-After and the client tries again.
READ_RETRY_BUDGET_S = 0.25


@dataclasses.dataclass(frozen=True, slots=True)
class Row(Mapping[str, Any]):
    """A frozen row: each field is a column (or a named expression) of the statement that read it.

    Read it by attribute (`row.status`, typed); it is also a read-only mapping of its fields, so code
    written for any mapping of columns (`run_diff`, a response schema's `model_validate`, `{**row}`)
    takes it as it is."""

    # The columns a subclass's statements qualify with a table alias (`r.` for workflow runs).
    table_alias: ClassVar[str] = ""

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return _field_names(cls)

    @classmethod
    def columns(cls, alias: str | None = None, *, skip: Iterable[str] = ()) -> str:
        """`a.x, a.y, ...`: the fields as a select list (`alias` defaults to `table_alias`)."""
        alias = cls.table_alias if alias is None else alias
        prefix = f"{alias}." if alias else ""
        left_out = set(skip)
        return ", ".join(f"{prefix}{n}" for n in cls.names() if n not in left_out)

    @classmethod
    def of(cls, record: asyncpg.Record) -> Self:
        return cls(**record)

    @classmethod
    def maybe(cls, record: asyncpg.Record | None) -> Self | None:
        return None if record is None else cls(**record)

    @classmethod
    def all(cls, records: Iterable[asyncpg.Record]) -> list[Self]:
        return [cls(**r) for r in records]

    def as_dict(self) -> dict[str, Any]:
        """The fields by name (shallow): to merge with computed fields into a response schema."""
        return {n: getattr(self, n) for n in _field_names(type(self))}

    def __getitem__(self, name: str) -> Any:
        if name not in _field_names(type(self)):
            raise KeyError(name)
        return getattr(self, name)

    def __iter__(self) -> Iterator[str]:
        return iter(_field_names(type(self)))

    def __len__(self) -> int:
        return len(_field_names(type(self)))


_NAMES: dict[type[Row], tuple[str, ...]] = {}


def _field_names(cls: type[Row]) -> tuple[str, ...]:
    names = _NAMES.get(cls)
    if names is None:
        names = _NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


async def reading(db: Reader, read: Callable[[Reader], Awaitable[T]], what: str) -> T:
    """`read(db)`, retried through lost connections when `db` is the pool (see the module)."""
    if isinstance(db, asyncpg.Pool):
        return await retry_transient(lambda: read(db), what, budget_s=READ_RETRY_BUDGET_S)
    return await read(db)


async def fetch(db: Reader, sql: str, *args: Any) -> list[asyncpg.Record]:
    return await reading(db, lambda d: d.fetch(sql, *args), "read")


async def fetchrow(db: Reader, sql: str, *args: Any) -> asyncpg.Record | None:
    return await reading(db, lambda d: d.fetchrow(sql, *args), "read")


async def fetchval(db: Reader, sql: str, *args: Any) -> Any:
    return await reading(db, lambda d: d.fetchval(sql, *args), "read")


DbRow: TypeAlias = Mapping[str, Any]
"""What code outside `stevora.db` takes when it did not get a typed `Row` (the engine's run and
step records, the rows of `stevora.db`'s write modules): a read-only mapping of columns. A typed
`Row` is one too."""
