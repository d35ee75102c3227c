"""Schedules (docs/api/schedules.md)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AwareDatetime, Field, model_validator

from stevora.api.schemas.envelope import ApiIn, ApiOut, Stored, Timestamp
from stevora.definitions.triggers import OverlapPolicy, ScheduleTiming


class ScheduleCreate(ScheduleTiming):
    """A schedule: a definition (`definitionId`, or `definitionName` with `version`, pinned or
    `"latest"`, resolved at each tick) and its clock."""

    name: str | None = Field(default=None, min_length=1, max_length=200)
    """Unique in the workspace; the schedule's id when not given."""
    definition_id: str | None = Field(default=None, max_length=40)
    definition_name: str | None = Field(default=None, min_length=1, max_length=200)
    version: str = Field(default="latest", min_length=1, max_length=50)

    @model_validator(mode="after")
    def _one_definition(self) -> ScheduleCreate:
        if (self.definition_id is None) == (self.definition_name is None):
            raise ValueError("give exactly one of definitionId and definitionName")
        return self


class ScheduleUpdate(ApiIn):
    """Fields to change; the rest stay. `paused: true` pauses, `false` resumes."""

    name: str | None = Field(default=None, min_length=1, max_length=200)
    cron: str | None = None
    interval_s: int | None = None
    timezone: str | None = None
    input: dict[str, Any] | None = None
    overlap: OverlapPolicy | None = None
    catchup_window_s: int | None = None
    jitter_s: int | None = None
    start_at: AwareDatetime | None = None
    end_at: AwareDatetime | None = None
    paused: bool | None = None
    version: str | None = Field(default=None, min_length=1, max_length=50)


class ScheduleRun(ApiOut):
    run_id: str
    scheduled_at: Timestamp
    status: str | None
    kind: str = Field(description="tick, manual (trigger now) or backfill")


class ScheduleOut(ApiOut):
    id: str = Field(examples=["sch_abc123"])
    name: str
    definition_name: str
    version: str
    source: str = Field(description="api, or definition when a definition's `schedule` keeps it")
    cron: str | None
    interval_s: int | None
    timezone: str
    input: Annotated[dict[str, Any], Stored]
    overlap: OverlapPolicy
    catchup_window_s: int
    jitter_s: int
    start_at: Timestamp | None
    end_at: Timestamp | None
    paused: bool
    next_fire_times: list[Timestamp] = Field(description="The next 5 ticks (also while paused).")
    last_runs: list[ScheduleRun] = Field(description="The runs of the latest ticks, newest first.")
    ticks_run: int
    ticks_skipped: int
    created_at: Timestamp
    updated_at: Timestamp


class BackfillBody(ApiIn):
    from_: AwareDatetime = Field(alias="from")
    to: AwareDatetime


class TriggeredRun(ApiOut):
    run_id: str
    scheduled_at: Timestamp
