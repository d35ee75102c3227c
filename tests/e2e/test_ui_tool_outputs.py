"""Awaited tool calls in the web UI (headless Chromium): a person answers a run's client-executed
tool calls on its run page, and a workflow called as a tool links parent and child run pages."""

from __future__ import annotations

from typing import Any

import pytest

from stevora.engine import commands
from tests.awaited_tools import LOCATION, WEATHER
from tests.conftest import Harness, create_definition
from tests.e2e import ui_fixtures
from tests.e2e.ui_fixtures import UiServer, login, screenshot

pytestmark = pytest.mark.browser

chromium_path = ui_fixtures.chromium_path
browser = ui_fixtures.browser
ui_server = ui_fixtures.ui_server
context = ui_fixtures.context

TRACES_SQL = "SELECT tool_call_id, status, output_json, error FROM tool_trace WHERE workflow_run_id = $1"


async def _client_tool_run(harness: Harness, workspace_id: str) -> tuple[str, list[str]]:
    """A run waiting for two client-executed calls; returns (run id, [call ids] in the model's order)."""
    def_id = await create_definition(harness.rt, workspace_id, {
        "name": "trip-outfit", "version": "1",
        "steps": [{"type": "llm", "name": "advise", "model": "scripted", "tools": [WEATHER, LOCATION],
                   "messages": [{"role": "user", "content": "What should I wear today?"}]}],
    })  # fmt: skip
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id, {})
    await harness.wait_for_status(run["id"], "WAITING")
    calls = await harness.rt.pool.fetch(
        "SELECT tool_call_id FROM awaited_tool_calls WHERE workflow_run_id = $1 ORDER BY sequence", run["id"]
    )
    return run["id"], [c["tool_call_id"] for c in calls]


async def test_a_person_answers_the_pending_client_calls_on_the_run_page(
    harness: Harness, workspace_id: str, ui_server: UiServer, context: Any
) -> None:
    run_id, (weather_id, location_id) = await _client_tool_run(harness, workspace_id)
    page = await context.new_page()
    await login(page, ui_server.api_key, f"/ui/runs/{run_id}")

    section = page.locator("#tool-outputs")
    assert "Waiting for tool outputs" in await section.inner_text()
    weather = section.locator(f"[data-tool-call-id='{weather_id}']")
    location = section.locator(f"[data-tool-call-id='{location_id}']")
    assert "get_weather" in await weather.inner_text() and "city" in await weather.inner_text()
    assert "get_location" in await location.inner_text()
    assert "answer it above" in await page.locator(f"#call-{weather_id}").inner_text()
    await screenshot(page, "08-run-waiting-for-tool-outputs")

    # Not JSON: a clear message, nothing recorded, both calls still pending.
    await weather.locator("textarea[name=output]").fill("{tempC: 18")
    await weather.locator("button:has-text('Submit output')").click()
    flash = page.locator(".flash-error")
    await flash.wait_for()
    assert "not valid JSON" in await flash.inner_text() and weather_id in await flash.inner_text()
    assert await harness.rt.pool.fetch(TRACES_SQL, run_id) == []
    assert await page.locator("#tool-outputs [data-tool-call-id]").count() == 2

    # A forged form (no valid CSRF token) is refused and records nothing.
    forged = await page.request.post(
        f"/ui/runs/{run_id}/tool-outputs",
        form={"tool_call_id": weather_id, "answer": "output", "output": "1", "csrf": "0" * 64},
        max_redirects=0,
    )
    assert forged.status == 403
    assert await harness.rt.pool.fetch(TRACES_SQL, run_id) == []

    # A JSON output: recorded; the run still waits for the other call.
    weather = page.locator(f"#tool-outputs [data-tool-call-id='{weather_id}']")
    await weather.locator("textarea[name=output]").fill('{"tempC": 18, "conditions": "light rain"}')
    await weather.locator("button:has-text('Submit output')").click()
    await page.locator(".flash-ok").wait_for()
    assert weather_id in await page.locator(".flash-ok").inner_text()
    assert await page.locator("#tool-outputs [data-tool-call-id]").count() == 1
    assert "light rain" in await page.locator(f"#call-{weather_id}").inner_text()

    # An error for the last call: the run resumes and completes; the page follows it live.
    location = page.locator(f"#tool-outputs [data-tool-call-id='{location_id}']")
    await location.locator("summary:has-text('Report an error')").click()
    await location.locator("input[name=error]").fill("Location permission denied")
    await location.locator("button:has-text('Fail the call')").click()
    await page.locator(".flash-ok").wait_for()
    row = await harness.wait_for_status(run_id, "COMPLETED", "FAILED")
    assert row["status"] == "COMPLETED", row["error"]
    await page.locator("#run-status .pill-completed").wait_for()
    assert await page.locator("#tool-outputs").count() == 0
    traces = {t["tool_call_id"]: t for t in await harness.rt.pool.fetch(TRACES_SQL, run_id)}
    assert traces[weather_id]["output_json"] == {"tempC": 18, "conditions": "light rain"}
    assert traces[location_id]["status"] == "failed"
    assert traces[location_id]["error"] == "Location permission denied"
    assert "Location permission denied" in await page.locator(f"#call-{location_id}").inner_text()
    await screenshot(page, "09-run-tool-outputs-answered")


async def test_a_workflow_tool_call_links_to_its_child_run_and_back(
    harness: Harness, workspace_id: str, ui_server: UiServer, context: Any
) -> None:
    async def summarise(ctx: Any) -> dict[str, Any]:
        return {"status": "completed", "stateUpdates": {"summary": f"About {ctx.workflow_input['topic']}"}}

    harness.tasks.register("summarise", summarise)
    await create_definition(harness.rt, workspace_id, {
        "name": "summarise-topic", "version": "1", "description": "Summarise a topic",
        "defaultParams": "topic",
        "steps": [{"type": "task", "name": "summarise", "handler": "summarise"}],
    })  # fmt: skip
    parent_def = await create_definition(harness.rt, workspace_id, {
        "name": "research-lead", "version": "1",
        "steps": [{"type": "llm", "name": "research", "model": "scripted",
                   "messages": [{"role": "user", "content": "Research tides"}],
                   "tools": [{"name": "summarise", "workflow": "summarise-topic"}]}],
    })  # fmt: skip
    run, _ = await commands.create_run(harness.rt, workspace_id, parent_def, {})
    parent_id = run["id"]
    row = await harness.wait_for_status(parent_id, "COMPLETED", "FAILED")
    assert row["status"] == "COMPLETED", row["error"]
    child = await harness.rt.pool.fetchrow(
        "SELECT id, parent_tool_call_id FROM workflow_runs WHERE parent_run_id = $1", parent_id
    )

    page = await context.new_page()
    await login(page, ui_server.api_key, f"/ui/runs/{parent_id}")
    call = page.locator(f"#call-{child['parent_tool_call_id']}")
    assert "summarise" in await call.inner_text()
    link = call.locator("a.child-run-link")
    assert child["id"] in await link.inner_text()
    await link.click()
    await page.wait_for_url(f"**/ui/runs/{child['id']}")
    back = page.locator(".parent-link")
    assert parent_id in await back.inner_text() and child["parent_tool_call_id"] in await back.inner_text()
    await screenshot(page, "10-child-run-links-to-parent")
    await back.locator("a").click()
    await page.wait_for_url(f"**/ui/runs/{parent_id}#call-{child['parent_tool_call_id']}")
    assert await page.locator(f"#call-{child['parent_tool_call_id']} a.child-run-link").count() == 1


async def test_a_tool_steps_call_shows_its_input_and_result_on_the_run_page(
    harness: Harness, workspace_id: str, ui_server: UiServer, context: Any
) -> None:
    async def lookup_order(input: dict[str, Any]) -> dict[str, Any]:
        return {"orderId": input["orderId"], "amount": 120}

    harness.tools.register(
        "lookup_order",
        lookup_order,
        parameters={"type": "object", "properties": {"orderId": {"type": "string"}}, "required": ["orderId"]},
    )
    def_id = await create_definition(harness.rt, workspace_id, {
        "name": "order-lookup", "version": "1",
        "steps": [{"type": "tool", "name": "lookup", "tool": "lookup_order", "input": {"orderId": "{{input.orderId}}"}}],
    })  # fmt: skip
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id, {"orderId": "ord_1042"})
    await harness.wait_for_status(run["id"], "COMPLETED")
    page = await context.new_page()
    await login(page, ui_server.api_key, f"/ui/runs/{run['id']}")
    call = page.locator("#call-step\\:lookup")
    text = await call.inner_text()
    assert "lookup_order" in text and "ord_1042" in text and "120" in text and ":tool" in text
