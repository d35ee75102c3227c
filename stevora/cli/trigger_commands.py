"""`stevora schedules ...` and `stevora events ...`: triggers over HTTP (docs/triggers.md, docs/cli.md)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.markup import escape

from stevora.cli import app, output
from stevora.cli.output import JsonFlag
from stevora.cli.remote import DEFAULT_URL, ApiKey, Url, connect
from stevora.client.triggers import Event, Schedule

console = output.make_console()
err = output.make_console(stderr=True)

schedules_app = typer.Typer(help="Schedules that start runs on a clock.", no_args_is_help=True)
events_app = typer.Typer(help="Events that start and resume runs.", no_args_is_help=True)
app.add_typer(schedules_app, name="schedules")
app.add_typer(events_app, name="events")

ScheduleId = Annotated[str, typer.Argument(help="A schedule id (sch_...).")]


def _json_object(text: str | None, option: str) -> dict[str, Any]:
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise typer.BadParameter(f"not JSON: {exc}", param_hint=option) from None
    if not isinstance(value, dict):
        raise typer.BadParameter("must be a JSON object", param_hint=option)
    return value


def _show(schedule: Schedule) -> None:
    clock = schedule.cron or f"every {schedule.interval_s} s"
    state = "paused" if schedule.paused else "active"
    console.print(
        f"{schedule.id}  {escape(schedule.name)}  {escape(schedule.definition_name)}@{schedule.version}  "
        f"{escape(clock)} ({schedule.timezone})  {state}  overlap={schedule.overlap}  "
        f"ran {schedule.ticks_run}, skipped {schedule.ticks_skipped}"
    )


@schedules_app.command("create")
def schedules_create(
    definition: Annotated[str, typer.Argument(help="Definition name.")],
    cron: Annotated[str | None, typer.Option(help="5 fields, or 6 with seconds first.")] = None,
    every: Annotated[
        int | None, typer.Option("--every", help="Interval in seconds (instead of --cron).")
    ] = None,
    timezone: Annotated[str, typer.Option(help="IANA time zone of the cron fields.")] = "UTC",
    version: Annotated[str, typer.Option(help='A version, or "latest" (resolved at each tick).')] = "latest",
    input: Annotated[
        str | None, typer.Option("--input", help="Run input as JSON ({{schedule.scheduledAt}}).")
    ] = None,
    overlap: Annotated[str, typer.Option(help="skip | buffer_one | allow | cancel_previous")] = "skip",
    name: Annotated[str | None, typer.Option(help="A unique name (default: generated).")] = None,
    paused: Annotated[bool, typer.Option("--paused", help="Create it paused.")] = False,
    as_json: JsonFlag = False,
    url: Url = DEFAULT_URL,
    api_key: ApiKey = None,
) -> None:
    """Create a schedule for a definition."""
    body = _json_object(input, "--input")
    with connect(url, api_key) as rt:
        made = rt.schedules.create(
            definition_name=definition, cron=cron, interval_s=every, timezone=timezone, version=version,
            input=body, overlap=overlap, name=name, paused=paused,
        )  # fmt: skip
    if as_json:
        output.emit(made)
        return
    _show(made)
    for at in made.next_fire_times:
        console.print(f"  next: {at.isoformat()}")


@schedules_app.command("list")
def schedules_list(as_json: JsonFlag = False, url: Url = DEFAULT_URL, api_key: ApiKey = None) -> None:
    """List the workspace's schedules."""
    with connect(url, api_key) as rt:
        found = rt.schedules.list(page_size=100).data
    if as_json:
        output.emit(found)
        return
    for schedule in found:
        _show(schedule)


@schedules_app.command("show")
def schedules_show(
    schedule_id: ScheduleId, as_json: JsonFlag = False, url: Url = DEFAULT_URL, api_key: ApiKey = None
) -> None:
    """One schedule: its next fire times and its latest runs."""
    with connect(url, api_key) as rt:
        schedule = rt.schedules.get(schedule_id)
    if as_json:
        output.emit(schedule)
        return
    _show(schedule)
    for at in schedule.next_fire_times:
        console.print(f"  next: {at.isoformat()}")
    for run in schedule.last_runs:
        console.print(f"  ran:  {run.scheduled_at.isoformat()}  {run.run_id}  {run.status}  ({run.kind})")


def _set_paused(schedule_id: str, paused: bool, url: str, api_key: str | None) -> None:
    with connect(url, api_key) as rt:
        _show(rt.schedules.update(schedule_id, paused=paused))


@schedules_app.command("pause")
def schedules_pause(schedule_id: ScheduleId, url: Url = DEFAULT_URL, api_key: ApiKey = None) -> None:
    """Pause a schedule (it starts nothing until resumed)."""
    _set_paused(schedule_id, True, url, api_key)


@schedules_app.command("resume")
def schedules_resume(schedule_id: ScheduleId, url: Url = DEFAULT_URL, api_key: ApiKey = None) -> None:
    """Resume a schedule from its next tick (missed ticks are not run)."""
    _set_paused(schedule_id, False, url, api_key)


@schedules_app.command("trigger")
def schedules_trigger(schedule_id: ScheduleId, url: Url = DEFAULT_URL, api_key: ApiKey = None) -> None:
    """Start one run now; prints its id."""
    with connect(url, api_key) as rt:
        started = rt.schedules.trigger(schedule_id)
    print(started.run_id)


@schedules_app.command("backfill")
def schedules_backfill(
    schedule_id: ScheduleId,
    start: Annotated[str, typer.Option("--from", help="ISO 8601 with a zone.")],
    end: Annotated[str, typer.Option("--to", help="ISO 8601 with a zone.")],
    url: Url = DEFAULT_URL,
    api_key: ApiKey = None,
) -> None:
    """Run the ticks of a past range (each once); prints `scheduledAt runId` lines."""
    with connect(url, api_key) as rt:
        started = rt.schedules.backfill(schedule_id, start, end)
    for run in started:
        print(f"{run.scheduled_at.isoformat()} {run.run_id}")


@schedules_app.command("delete")
def schedules_delete(schedule_id: ScheduleId, url: Url = DEFAULT_URL, api_key: ApiKey = None) -> None:
    """Delete a schedule (its runs stay)."""
    with connect(url, api_key) as rt:
        rt.schedules.delete(schedule_id)
    err.print(f"Deleted schedule {schedule_id}.")


def _show_event(event: Event) -> None:
    note = "  (seen before)" if event.deduplicated else ""
    console.print(f"{escape(event.id)}  {escape(event.name)}  {len(event.runs)} run(s){note}")
    for run in event.runs:
        console.print(f"  {run.kind}: {run.run_id}  {run.status}")


@events_app.command("send")
def events_send(
    name: Annotated[str, typer.Argument(help="Event name, e.g. order.paid.")],
    data: Annotated[str | None, typer.Option("--data", help="The event's data as a JSON object.")] = None,
    event_id: Annotated[str | None, typer.Option("--id", help="Deduplication id.")] = None,
    as_json: JsonFlag = False,
    url: Url = DEFAULT_URL,
    api_key: ApiKey = None,
) -> None:
    """Send an event; prints the runs it started (or, for a repeated --id, the first send's)."""
    body = _json_object(data, "--data")
    with connect(url, api_key) as rt:
        event = rt.events.send(name, body, id=event_id)
    if as_json:
        output.emit(event)
        return
    _show_event(event)


@events_app.command("list")
def events_list(
    name: Annotated[str | None, typer.Option(help="Only events of this name.")] = None,
    as_json: JsonFlag = False,
    url: Url = DEFAULT_URL,
    api_key: ApiKey = None,
) -> None:
    """Recent events, newest first, with the runs each started."""
    with connect(url, api_key) as rt:
        found = rt.events.list(name=name, page_size=50).data
    if as_json:
        output.emit(found)
        return
    for event in found:
        _show_event(event)
