"""The client's side of triggers (docs/triggers.md): schedules, events and inbound hooks.

Operations are written once as generators of requests (`stevora.client.protocol`); the sync and
async clients run them (`client.schedules`, `client.events`, `client.hooks`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from urllib.parse import quote

from stevora.client.models import Model, Page
from stevora.client.protocol import Op, Request, parse, parse_list, parse_page


def _path(*parts: str) -> str:
    return "/v1/" + "/".join(quote(p, safe="") if i else p for i, p in enumerate(parts))


class ScheduleRun(Model):
    run_id: str
    scheduled_at: datetime
    status: str | None = None
    kind: str = "tick"


class Schedule(Model):
    id: str
    name: str
    definition_name: str
    version: str
    source: str = "api"
    cron: str | None = None
    interval_s: int | None = None
    timezone: str = "UTC"
    input: dict[str, Any] = {}
    overlap: str = "skip"
    catchup_window_s: int = 60
    jitter_s: int = 0
    start_at: datetime | None = None
    end_at: datetime | None = None
    paused: bool = False
    next_fire_times: list[datetime] = []
    last_runs: list[ScheduleRun] = []
    ticks_run: int = 0
    ticks_skipped: int = 0


class TriggeredRun(Model):
    run_id: str
    scheduled_at: datetime


class EventRun(Model):
    run_id: str
    kind: str
    status: str | None = None
    definition_id: str | None = None


class Event(Model):
    id: str
    name: str
    data: Any = None
    ts: datetime | None = None
    source: str = "api"
    deduplicated: bool = False
    runs: list[EventRun] = []


class Hook(Model):
    id: str
    provider: str
    event: str | None = None
    url: str


class CreatedHook(Hook):
    secret: str
    """The signing secret to give the third party. The server shows it only once."""


def create_schedule(
    *, definition_name: str | None = None, definition_id: str | None = None, **fields: Any
) -> Op[Schedule]:
    """A schedule: `cron=` or `interval_s=`, and any other field in snake_case (`timezone`,
    `input`, `overlap`, `catchup_window_s`, `jitter_s`, `start_at`, `end_at`, `paused`, `version`, `name`)."""
    body = {"definitionName": definition_name, "definitionId": definition_id, **_camel(fields)}
    body = {k: v for k, v in body.items() if v is not None}
    return parse(Schedule, (yield Request("POST", _path("schedules"), json=body)))


def list_schedules(*, page: int = 1, page_size: int = 20) -> Op[Page[Schedule]]:
    return parse_page(
        Schedule, (yield Request("GET", _path("schedules"), params={"page": page, "pageSize": page_size}))
    )


def get_schedule(schedule_id: str) -> Op[Schedule]:
    return parse(Schedule, (yield Request("GET", _path("schedules", schedule_id))))


def update_schedule(schedule_id: str, **fields: Any) -> Op[Schedule]:
    """Change fields (snake_case); `paused=True` pauses, `paused=False` resumes."""
    return parse(Schedule, (yield Request("PATCH", _path("schedules", schedule_id), json=_camel(fields))))


def delete_schedule(schedule_id: str) -> Op[Schedule]:
    return parse(Schedule, (yield Request("DELETE", _path("schedules", schedule_id))))


def trigger_schedule(schedule_id: str) -> Op[TriggeredRun]:
    """One run now, whatever the overlap policy."""
    return parse(TriggeredRun, (yield Request("POST", _path("schedules", schedule_id, "trigger"))))


def backfill_schedule(schedule_id: str, start: datetime | str, end: datetime | str) -> Op[list[TriggeredRun]]:
    """Run the ticks in [start, end] (each once)."""
    body = {"from": _iso(start), "to": _iso(end)}
    return parse_list(
        TriggeredRun, (yield Request("POST", _path("schedules", schedule_id, "backfill"), json=body))
    )


def send_event(
    name: str, data: dict[str, Any] | None = None, *, id: str | None = None, ts: datetime | str | None = None
) -> Op[Event]:
    """Send an event; `.runs` are the runs it started (or, for a repeated `id`, the first post's)."""
    body: dict[str, Any] = {"name": name, "data": data or {}}
    if id is not None:
        body["id"] = id
    if ts is not None:
        body["ts"] = _iso(ts)
    return parse(Event, (yield Request("POST", _path("events"), json=body)))


def list_events(*, name: str | None = None, page: int = 1, page_size: int = 20) -> Op[Page[Event]]:
    params = {"name": name, "page": page, "pageSize": page_size}
    return parse_page(Event, (yield Request("GET", _path("events"), params=params)))


def create_hook(provider: str, *, event: str | None = None) -> Op[CreatedHook]:
    body: dict[str, Any] = {"provider": provider}
    if event is not None:
        body["event"] = event
    return parse(CreatedHook, (yield Request("POST", _path("hooks"), json=body)))


def list_hooks() -> Op[list[Hook]]:
    return parse_list(Hook, (yield Request("GET", _path("hooks"))))


def delete_hook(hook_id: str) -> Op[Hook]:
    return parse(Hook, (yield Request("DELETE", _path("hooks", hook_id))))


def _iso(value: datetime | str) -> str:
    return value.isoformat() if isinstance(value, datetime) else value


def _camel(fields: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in fields.items():
        head, *rest = key.split("_")
        out[head + "".join(p.capitalize() for p in rest)] = (
            _iso(value) if isinstance(value, datetime) else value
        )
    return out
