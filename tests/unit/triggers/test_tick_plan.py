"""The due pass's decision for one schedule (`plan_ticks`): overlap policies, buffering, catch-up
and lateness, without a database (the batched and one-by-one passes both carry these plans out)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from stevora.triggers.schedules import plan_ticks

ANCHOR = datetime(2026, 1, 1, tzinfo=UTC)
GRACE = timedelta(seconds=2)


def _row(overlap: str = "allow", *, fire: datetime | None = None, buffered: datetime | None = None,
         catchup_s: int = 0) -> dict[str, Any]:  # fmt: skip
    fire = fire or ANCHOR + timedelta(seconds=60)
    return {
        "id": "sch_1", "cron": None, "interval_s": 60, "timezone": "UTC", "start_at": None,
        "end_at": None, "created_at": ANCHOR, "overlap": overlap, "catchup_window_s": catchup_s,
        "jitter_s": 0, "next_fire_at": fire, "next_due_at": fire, "buffered_at": buffered,
    }  # fmt: skip


NOW = ANCHOR + timedelta(seconds=60, milliseconds=300)  # the 00:01:00 tick, 300 ms late


@pytest.mark.parametrize("overlap", ["allow", "skip", "buffer_one", "cancel_previous"])
def test_a_due_tick_with_no_active_run_starts_once_and_the_next_tick_follows(overlap: str) -> None:
    plan = plan_ticks(_row(overlap), NOW, active=False, grace=GRACE)
    assert plan.start == [ANCHOR + timedelta(seconds=60)]
    assert plan.next_fire_at == ANCHOR + timedelta(seconds=120) and plan.skipped == 0
    assert not plan.cancel_previous and plan.buffered_at is None


def test_with_an_active_run_each_policy_does_what_it_says() -> None:
    tick = ANCHOR + timedelta(seconds=60)
    skip = plan_ticks(_row("skip"), NOW, active=True, grace=GRACE)
    assert (skip.start, skip.skipped) == ([], 1)
    buffered = plan_ticks(_row("buffer_one"), NOW, active=True, grace=GRACE)
    assert (buffered.start, buffered.buffered_at, buffered.skipped) == ([], tick, 0)
    already = plan_ticks(_row("buffer_one", buffered=ANCHOR), NOW, active=True, grace=GRACE)
    assert (already.start, already.buffered_at, already.skipped) == ([], ANCHOR, 1)  # one buffered at most
    allow = plan_ticks(_row("allow"), NOW, active=True, grace=GRACE)
    assert (allow.start, allow.cancel_previous) == ([tick], False)
    cancel = plan_ticks(_row("cancel_previous"), NOW, active=True, grace=GRACE)
    assert (cancel.start, cancel.cancel_previous) == ([tick], True)


def test_a_buffered_tick_starts_when_the_run_ended_and_the_due_tick_is_buffered_behind_it() -> None:
    plan = plan_ticks(_row("buffer_one", buffered=ANCHOR), NOW, active=False, grace=GRACE)
    assert plan.start == [ANCHOR] and plan.buffered_at == ANCHOR + timedelta(seconds=60)


def test_missed_ticks_inside_the_window_make_one_run_for_the_latest_and_the_rest_are_counted() -> None:
    now = ANCHOR + timedelta(minutes=10, milliseconds=5)
    plan = plan_ticks(_row(catchup_s=300), now, active=False, grace=GRACE)
    assert plan.start == [ANCHOR + timedelta(minutes=10)] and plan.skipped == 9 and not plan.late
    assert plan.next_fire_at == ANCHOR + timedelta(minutes=11)


def test_a_tick_later_than_the_window_and_grace_is_skipped_as_late() -> None:
    now = ANCHOR + timedelta(seconds=63)
    plan = plan_ticks(_row(), now, active=False, grace=GRACE)
    assert plan.start == [] and plan.late and plan.skipped == 1
    assert plan.next_fire_at == ANCHOR + timedelta(seconds=120)


def test_a_schedule_not_due_yet_only_runs_its_buffered_tick() -> None:
    early = ANCHOR + timedelta(seconds=30)
    assert plan_ticks(_row(), early, active=False, grace=GRACE).start == []
    plan = plan_ticks(_row("buffer_one", buffered=ANCHOR), early, active=False, grace=GRACE)
    assert plan.start == [ANCHOR] and plan.next_fire_at == ANCHOR + timedelta(seconds=60)
