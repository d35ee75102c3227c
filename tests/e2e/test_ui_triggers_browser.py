"""The schedules and events pages in headless Chromium: a schedule's next fire times (a cron line
in its zone), pause and resume, "Trigger now", the runs its ticks started (linked to their pages),
and each event with the runs it started or resumed. Screenshots in test-artifacts/screenshots/."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from stevora.definitions.triggers import ScheduleTiming
from stevora.engine import commands
from stevora.triggers import schedule_store, schedules
from stevora.triggers.events import IncomingEvent, receive
from tests.conftest import Harness, create_definition
from tests.e2e import ui_fixtures
from tests.e2e.ui_fixtures import UiServer, login, screenshot

pytestmark = pytest.mark.browser

chromium_path = ui_fixtures.chromium_path
browser = ui_fixtures.browser
ui_server = ui_fixtures.ui_server
context = ui_fixtures.context

QUICK = [{"name": "pause", "type": "wait", "durationMs": 0}]
BERLIN = ZoneInfo("Europe/Berlin")


async def _schedule(harness: Harness, workspace_id: str, name: str, **timing: Any) -> Any:
    return await schedule_store.create(
        harness.rt, workspace_id, ScheduleTiming.model_validate(timing), name=name,
        definition_id=None, definition_name="tick", version="latest",
    )  # fmt: skip


async def _times(row: Any) -> list[datetime]:
    stamps = await row.locator("td:nth-child(4) time").evaluate_all("els => els.map(e => e.dateTime)")
    return [datetime.fromisoformat(s.replace("Z", "+00:00")) for s in stamps]


async def test_the_schedules_page_shows_fire_times_pauses_resumes_triggers_and_the_runs_ticks_started(
    harness: Harness, workspace_id: str, ui_server: UiServer, context: Any
) -> None:
    await create_definition(harness.rt, workspace_id, {"name": "tick", "version": "1", "steps": QUICK})
    early = await _schedule(harness, workspace_id, "early", cron="15 4 * * *", timezone="Europe/Berlin")
    ticking = await _schedule(harness, workspace_id, "hourly", intervalS=3600, overlap="allow")
    # As if the hourly tick fell due just now: a worker's due pass starts its run.
    await harness.rt.pool.execute(
        "UPDATE schedules SET next_fire_at = clock_timestamp() - interval '0.1 s', "
        "next_due_at = clock_timestamp() - interval '0.1 s' WHERE id = $1",
        ticking["id"],
    )
    # The pass serves every workspace's due schedules (an earlier test's may fall due too): this
    # workspace's tick is the run the pass started here.
    started = await schedules.due_pass(harness.rt)
    [ticked] = [
        r["id"]
        for r in await harness.rt.pool.fetch(
            "SELECT id FROM workflow_runs WHERE id = ANY($1::text[]) AND workspace_id = $2",
            started,
            workspace_id,
        )
    ]
    page = await context.new_page()
    await login(page, ui_server.api_key, "/ui/schedules")

    row = page.locator(f"#schedule-{early['id']}")
    fire = await _times(row)
    assert len(fire) == 3 and fire == sorted(fire) and fire[0] > datetime.now(BERLIN)
    assert {(t.astimezone(BERLIN).hour, t.astimezone(BERLIN).minute) for t in fire} == {(4, 15)}
    assert "15 4 * * *" in await row.inner_text() and "Europe/Berlin" in await row.inner_text()
    assert "none yet" in await row.locator("td:nth-child(5)").inner_text()
    hourly = page.locator(f"#schedule-{ticking['id']}")
    assert await hourly.locator(f"a[href='/ui/runs/{ticked}']").count() == 1  # the tick's run, linked
    await screenshot(page, "schedules-page")

    # Pause: the row says paused and offers Resume; the fire times are still shown.
    await row.locator("button", has_text="Pause").click()
    await page.locator(".flash-ok").wait_for()
    assert "Paused the schedule." in await page.locator(".flash-ok").inner_text()
    assert "paused" in await row.locator("td:nth-child(7)").inner_text()
    assert await harness.rt.pool.fetchval("SELECT paused FROM schedules WHERE id = $1", early["id"])
    assert len(await _times(row)) == 3
    await screenshot(page, "schedules-paused")
    await row.locator("button", has_text="Resume").click()
    await page.locator(".flash-ok").wait_for()
    assert "active" in await row.locator("td:nth-child(7)").inner_text()
    assert not await harness.rt.pool.fetchval("SELECT paused FROM schedules WHERE id = $1", early["id"])

    # Trigger now: one run, named in the flash and listed on the row; its link opens the run.
    await row.locator("button", has_text="Trigger now").click()
    await page.locator(".flash-ok").wait_for()
    started = await harness.rt.pool.fetchval("SELECT last_run_id FROM schedules WHERE id = $1", early["id"])
    assert started is not None and started in await page.locator(".flash-ok").inner_text()
    link = row.locator(f"a[href='/ui/runs/{started}']")
    assert await link.count() == 1
    assert "1 / 0" in await row.locator("td:nth-child(6)").inner_text()
    await screenshot(page, "schedules-triggered")
    await link.click()
    await page.wait_for_url(f"**/ui/runs/{started}")
    assert started in await page.content()


async def test_the_events_page_lists_each_event_with_the_runs_it_started_or_resumed(
    harness: Harness, workspace_id: str, ui_server: UiServer, context: Any
) -> None:
    triggered = await create_definition(
        harness.rt, workspace_id, {"name": "on-paid", "version": "1", "steps": QUICK}
    )
    await harness.rt.pool.execute(
        "INSERT INTO event_triggers (workspace_id, definition_name, trigger_index, definition_id, event_name, spec) "
        "VALUES ($1, 'on-paid', 0, $2, 'order.paid', $3)",
        workspace_id, triggered, {"event": "order.paid", "if": "data.amount >= 100"},
    )  # fmt: skip
    waiting = await create_definition(harness.rt, workspace_id, {"name": "ship", "version": "1", "steps": [
        {"name": "shipped", "type": "external_event", "event": "order.shipped",
         "match": "data.orderId == input.orderId", "timeoutMs": 600_000}]})  # fmt: skip
    wait_run, _ = await commands.create_run(harness.rt, workspace_id, waiting, {"orderId": "o1"})
    await harness.wait_for_status(wait_run["id"], "WAITING")
    await receive(harness.rt, workspace_id, [
        IncomingEvent("order.paid", {"amount": 120}, id="paid-big"),
        IncomingEvent("order.paid", {"amount": 5}, id="paid-small"),
        IncomingEvent("order.shipped", {"orderId": "o1"}, id="shipped-o1"),
    ])  # fmt: skip
    started = await harness.rt.pool.fetchval(
        "SELECT id FROM workflow_runs WHERE definition_id = $1", triggered
    )
    await harness.wait_for_status(wait_run["id"], "COMPLETED")
    page = await context.new_page()
    await login(page, ui_server.api_key, "/ui/events")
    big = page.locator("tr[data-event-id='paid-big']")
    assert "order.paid" in await big.inner_text()
    assert await big.locator(f"a[href='/ui/runs/{started}']").count() == 1
    assert "started" in await big.locator("td:nth-child(5)").inner_text()
    assert "none" in await page.locator("tr[data-event-id='paid-small'] td:nth-child(5)").inner_text()
    shipped = page.locator("tr[data-event-id='shipped-o1']")
    assert "resumed" in await shipped.locator("td:nth-child(5)").inner_text()
    assert await shipped.locator(f"a[href='/ui/runs/{wait_run['id']}']").count() == 1
    assert "3" in await page.locator("h1 .count").inner_text()
    await screenshot(page, "events-page")
    await big.locator(f"a[href='/ui/runs/{started}']").click()
    await page.wait_for_url(f"**/ui/runs/{started}")
