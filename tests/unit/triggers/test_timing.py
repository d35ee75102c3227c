"""A schedule's ticks: cron across daylight-saving changes, intervals, jitter, start and end."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from stevora.definitions.triggers import ScheduleTiming
from stevora.triggers.timing import Clock, jitter

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")
ANCHOR = datetime(2026, 1, 1, tzinfo=UTC)


def _cron(expr: str, zone: str) -> Clock:
    return Clock(cron=expr, interval_s=None, timezone=zone, anchor=ANCHOR)


def test_a_wall_time_skipped_by_spring_forward_fires_once_at_the_first_instant_after_the_gap() -> None:
    # Berlin, 2026-03-29: 02:00 jumps to 03:00, so 02:30 does not exist that day.
    ticks = _cron("30 2 * * *", "Europe/Berlin").upcoming(datetime(2026, 3, 27, tzinfo=UTC), 4)
    local = [t.astimezone(BERLIN).strftime("%m-%d %H:%M") for t in ticks]
    assert local == ["03-27 02:30", "03-28 02:30", "03-29 03:00", "03-30 02:30"]


def test_half_hourly_ticks_in_the_gap_fire_once_not_twice_with_the_next_tick() -> None:
    ticks = _cron("0,30 * * * *", "Europe/Berlin").upcoming(datetime(2026, 3, 29, 0, 0, tzinfo=UTC), 4)
    local = [t.astimezone(BERLIN).strftime("%H:%M") for t in ticks]
    assert local == ["01:30", "03:00", "03:30", "04:00"]
    assert len(set(ticks)) == 4


def test_a_wall_time_repeated_by_fall_back_fires_once() -> None:
    # New York, 2026-11-01: 02:00 goes back to 01:00, so 01:30 happens twice.
    ticks = _cron("30 1 * * *", "America/New_York").upcoming(datetime(2026, 10, 31, tzinfo=UTC), 3)
    local = [t.astimezone(NEW_YORK).strftime("%m-%d %H:%M") for t in ticks]
    assert local == ["10-31 01:30", "11-01 01:30", "11-02 01:30"]
    assert ticks[2] - ticks[1] == timedelta(hours=25)


def test_six_fields_take_seconds_first() -> None:
    ticks = _cron("*/20 * * * * *", "UTC").upcoming(datetime(2026, 1, 1, 0, 0, 5, tzinfo=UTC), 3)
    assert [t.second for t in ticks] == [20, 40, 0]


def test_intervals_count_from_the_anchor_and_respect_start_and_end() -> None:
    clock = Clock(
        cron=None, interval_s=2, timezone="UTC", anchor=ANCHOR, end_at=ANCHOR + timedelta(seconds=6)
    )
    assert clock.upcoming(ANCHOR + timedelta(seconds=1, microseconds=5), 10) == [
        ANCHOR + timedelta(seconds=s) for s in (2, 4, 6)
    ]
    later = Clock(
        cron=None, interval_s=60, timezone="UTC", anchor=ANCHOR, start_at=ANCHOR + timedelta(days=1)
    )
    assert later.upcoming(ANCHOR, 1) == [ANCHOR + timedelta(days=1)]
    assert clock.between(ANCHOR, ANCHOR + timedelta(seconds=4), 100) == [
        ANCHOR, ANCHOR + timedelta(seconds=2), ANCHOR + timedelta(seconds=4)
    ]  # fmt: skip


def test_jitter_is_the_same_for_every_worker_and_within_bounds() -> None:
    tick = datetime(2026, 5, 1, tzinfo=UTC)
    assert jitter("sch_a", tick, 0) == timedelta(0)
    values = {jitter("sch_a", tick + timedelta(minutes=m), 30) for m in range(50)}
    assert all(timedelta(0) <= v < timedelta(seconds=30) for v in values) and len(values) > 10
    assert jitter("sch_a", tick, 30) == jitter("sch_a", tick, 30)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"cron": "* * * *"}, "5 fields"),
        ({"cron": "* * * * * * *"}, "5 fields"),
        ({"cron": "0 25 * * *"}, "invalid cron"),
        ({"intervalS": 5, "timezone": "Nowhere/City"}, "unknown IANA time zone"),
        ({}, "exactly one of cron and intervalS"),
        ({"intervalS": 5, "startAt": "2026-01-02T00:00:00Z", "endAt": "2026-01-01T00:00:00Z"}, "endAt"),
    ],
)
def test_bad_timings_are_refused_with_a_reason(body: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ScheduleTiming.model_validate(body)
