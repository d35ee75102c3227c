"""A schedule's ticks: cron lines through cronsim (in the schedule's IANA zone), or intervals.

Daylight saving: a wall-clock time that spring-forward skips fires once, at the first instant
after the gap; a time that fall-back repeats fires once (the first occurrence). Both are
cronsim's behaviour, pinned by tests/unit/triggers/test_timing.py.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import islice
from zoneinfo import ZoneInfo

from cronsim import CronSim


@dataclass(frozen=True, slots=True)
class Clock:
    """When a schedule ticks: `cron` in `timezone`, or every `interval_s` from `anchor`."""

    cron: str | None
    interval_s: int | None
    timezone: str
    anchor: datetime  # interval ticks are anchor + k * interval_s
    start_at: datetime | None = None
    end_at: datetime | None = None

    def next_after(self, after: datetime) -> datetime | None:
        """The first tick strictly after `after` (and not before `start_at`), or None past `end_at`."""
        if self.start_at is not None and after < self.start_at:
            after = self.start_at - timedelta(microseconds=1)
        tick = self._raw_next(after)
        if self.end_at is not None and tick > self.end_at:
            return None
        return tick

    def upcoming(self, after: datetime, count: int) -> list[datetime]:
        """The next `count` ticks after `after` (fewer when `end_at` comes first)."""
        return list(islice(self._ticks(after), count))

    def between(self, first: datetime, last: datetime, limit: int) -> list[datetime]:
        """Ticks in [first, last], at most `limit` (the caller says what more means)."""
        out: list[datetime] = []
        for tick in self._ticks(first - timedelta(microseconds=1)):
            if tick > last or len(out) >= limit:
                break
            out.append(tick)
        return out

    def _ticks(self, after: datetime) -> Iterator[datetime]:
        while (tick := self.next_after(after)) is not None:
            yield tick
            after = tick

    def _raw_next(self, after: datetime) -> datetime:
        if self.interval_s is not None:
            step = timedelta(seconds=self.interval_s)
            if after < self.anchor:
                return self.anchor
            periods = (after - self.anchor) // step + 1
            return self.anchor + periods * step
        assert self.cron is not None
        zone = ZoneInfo(self.timezone)
        # cronsim works on whole seconds (minutes for 5 fields) after the given wall time.
        local = after.astimezone(zone).replace(microsecond=0)
        return next(CronSim(self.cron, local)).astimezone(UTC)


def jitter(schedule_id: str, tick: datetime, jitter_s: int) -> timedelta:
    """A tick's start delay in [0, jitter_s): derived from the schedule and the tick, so every
    worker computes the same one."""
    if jitter_s <= 0:
        return timedelta(0)
    digest = hashlib.sha256(f"{schedule_id}|{tick.isoformat()}".encode()).digest()
    return timedelta(milliseconds=int.from_bytes(digest[:8], "big") % (jitter_s * 1000))
