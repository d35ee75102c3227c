"""What starts runs without a client: a `schedule` and event `triggers` (docs/triggers.md).

Both are checked here, where a definition or a schedule is parsed, so a bad cron line, time zone
or CEL expression is a 400 naming the field before anything is stored. Cron is parsed by
`cronsim` (daylight-saving transitions right), expressions compiled by `cel` (the
common-expression-language package); neither is a hand-written parser.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import cel
from cronsim import CronSim, CronSimError
from pydantic import AwareDatetime, Field, field_validator, model_validator

from stevora.definitions.retry import CamelModel

OverlapPolicy = Literal["skip", "buffer_one", "allow", "cancel_previous"]
MAX_CATCHUP_WINDOW_S = 366 * 86_400


def check_cron(expr: str) -> str:
    """A 5-field cron line, or 6 fields with seconds first; a ValueError says what is wrong."""
    fields = expr.split()
    if len(fields) not in (5, 6):
        raise ValueError(f"cron needs 5 fields (or 6 with seconds first), got {len(fields)}")
    try:
        CronSim(" ".join(fields), datetime(2000, 1, 1, tzinfo=ZoneInfo("UTC")))
    except CronSimError as exc:
        raise ValueError(f"invalid cron expression: {exc}") from None
    return " ".join(fields)


def check_timezone(name: str) -> str:
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown IANA time zone {name!r}") from None
    return name


def check_expression(source: str) -> str:
    """A CEL expression that compiles; a ValueError carries the parser's message."""
    try:
        cel.compile(source)
    except (ValueError, TypeError, RuntimeError) as exc:
        raise ValueError(f"invalid CEL expression: {exc}") from None
    return source


class ScheduleTiming(CamelModel):
    """When a schedule ticks and what it does with late or overlapping ticks."""

    cron: str | None = Field(default=None, min_length=1, max_length=200)
    """5 fields (minute hour day month weekday), or 6 with seconds first."""
    interval_s: int | None = Field(default=None, ge=1, le=366 * 86_400)
    """Every N seconds, counted from `startAt` (or the schedule's creation)."""
    timezone: str = Field(default="UTC", max_length=64)
    """IANA zone the cron fields are read in (daylight-saving transitions included)."""
    input: dict[str, Any] = Field(default_factory=dict)
    """The run's input; strings may hold `{{schedule.scheduledAt}}` (ISO 8601) and `{{schedule.id}}`."""
    overlap: OverlapPolicy = "skip"
    catchup_window_s: int = Field(default=60, ge=0, le=MAX_CATCHUP_WINDOW_S)
    """After downtime, missed ticks this recent make one run (the latest); older ones are skipped."""
    jitter_s: int = Field(default=0, ge=0, le=3600)
    """Each tick starts up to this many seconds late (fixed per tick, so every worker agrees)."""
    start_at: AwareDatetime | None = None
    end_at: AwareDatetime | None = None
    paused: bool = False

    _cron = field_validator("cron")(lambda cls, v: check_cron(v) if v is not None else None)
    _tz = field_validator("timezone")(lambda cls, v: check_timezone(v))

    @model_validator(mode="after")
    def _one_clock(self) -> ScheduleTiming:
        if (self.cron is None) == (self.interval_s is None):
            raise ValueError("give exactly one of cron and intervalS")
        if self.start_at is not None and self.end_at is not None and self.end_at <= self.start_at:
            raise ValueError("endAt must be after startAt")
        return self


class Debounce(CamelModel):
    """A burst of events with one `key` value starts one run, `periodMs` after the last one."""

    key: str = Field(min_length=1, max_length=1000)
    period_ms: int = Field(ge=1, le=7 * 86_400_000)

    _key = field_validator("key")(lambda cls, v: check_expression(v))


class Batch(CamelModel):
    """Up to `maxSize` events make one run with input `{"events": [...]}`, at the latest
    `timeoutMs` after the first one."""

    max_size: int = Field(ge=1, le=1000)
    timeout_ms: int = Field(ge=1, le=7 * 86_400_000)


class EventTrigger(CamelModel):
    """An event that starts a run of this definition (a `triggers` entry)."""

    event: str = Field(min_length=1, max_length=200)
    condition: str | None = Field(default=None, alias="if", max_length=4000)
    """CEL over the event's `name`, `data`, `id`, `ts`: a run starts only when it is true."""
    input: dict[str, Any] | None = None
    """The run's input, templated with `{{event.data.x}}` (and `{{event.name}}`, `{{event.id}}`);
    without it the event's `data` is the input."""
    debounce: Debounce | None = None
    batch: Batch | None = None

    _if = field_validator("condition")(lambda cls, v: check_expression(v) if v is not None else None)

    @model_validator(mode="after")
    def _one_grouping(self) -> EventTrigger:
        if self.debounce is not None and self.batch is not None:
            raise ValueError("a trigger takes debounce or batch, not both")
        return self
