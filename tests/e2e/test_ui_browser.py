"""The web UI in headless Chromium: runs list, a traced 3-round tool loop, a failed run, and an
approval decided from the inbox while the run page follows it live."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from stevora.engine import commands
from stevora.llm.messages import LlmResponse, ToolCall, Usage
from stevora.llm.scripted_provider import ScriptedProvider
from tests.conftest import Harness, create_definition
from tests.e2e import ui_fixtures
from tests.e2e.ui_fixtures import UiServer, login, screenshot

pytestmark = pytest.mark.browser

# The fixtures live in ui_fixtures.py; binding them here makes pytest find them for this module.
chromium_path = ui_fixtures.chromium_path
browser = ui_fixtures.browser
ui_server = ui_fixtures.ui_server
context = ui_fixtures.context

WEATHER = {"Lisbon": {"tempC": 21.5, "conditions": "sunny"}, "Oslo": {"tempC": 4.0, "conditions": "sleet"}}
EVENTS = [{"day": day, "title": f"Harbour concert #{day}"} for day in range(1, 21)]
FINAL_ANSWER = "Lisbon is 21.5 °C (70.7 °F) and sunny; Oslo has sleet at 4 °C. 20 events this month."


def _reply(calls: list[tuple[str, dict[str, Any]]] | None = None, text: str | None = None) -> LlmResponse:
    tool_calls = [
        ToolCall(id=f"call_{name}_{i}", name=name, arguments=json.dumps(args))
        for i, (name, args) in enumerate(calls or [])
    ]
    return LlmResponse(
        text=text,
        tool_calls=tool_calls,
        usage=Usage(input_tokens=180, output_tokens=42),
        model="scripted-test",
        finish_reason="tool_calls" if tool_calls else "stop",
        response_id=None,
        provider="scripted",
    )


async def _tool_loop_run(harness: Harness, workspace_id: str) -> tuple[str, list[tuple[Any, Any]]]:
    """A completed run whose llm step used tools in three rounds; returns (run id, [(args, result)])."""
    seen: list[tuple[Any, Any]] = []

    async def get_weather(args: dict[str, Any]) -> dict[str, Any]:
        result = {"city": args["city"], **WEATHER[args["city"]]}
        seen.append((args, result))
        return result

    async def convert_temp(args: dict[str, Any]) -> dict[str, Any]:
        result = {"fahrenheit": round(args["celsius"] * 9 / 5 + 32, 1)}
        seen.append((args, result))
        return result

    async def list_events(args: dict[str, Any]) -> dict[str, Any]:
        result = {"city": args["city"], "events": EVENTS[: args["limit"]]}
        seen.append((args, result))
        return result

    harness.tools.register(
        "get_weather", get_weather, description="Current weather for a city.",
        parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    )  # fmt: skip
    harness.tools.register("convert_temp", convert_temp)
    harness.tools.register("list_events", list_events)
    harness.rt.providers.register("scripted", ScriptedProvider(script=[
        _reply([("get_weather", {"city": "Lisbon"}), ("get_weather", {"city": "Oslo"})]),
        _reply([("convert_temp", {"celsius": 21.5})]),
        _reply([("list_events", {"city": "Lisbon", "limit": 20})]),
        _reply(text=FINAL_ANSWER),
    ]))  # fmt: skip
    def_id = await create_definition(harness.rt, workspace_id, {
        "name": "city-briefing", "version": "1.2.0", "description": "Weather and events for a trip.",
        "steps": [{
            "type": "llm", "name": "research", "model": "scripted-test", "maxToolRounds": 5,
            "systemPrompt": "You are a concise travel assistant.",
            "messages": [{"role": "user", "content": "Brief me on {{input.city}} vs Oslo."}],
            "tools": [
                "get_weather",
                {"name": "convert_temp", "description": "Celsius to Fahrenheit.",
                 "parameters": {"type": "object", "properties": {"celsius": {"type": "number"}},
                                "required": ["celsius"]}},
                {"name": "list_events", "description": "Upcoming events in a city.",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                                 "limit": {"type": "integer"}}}},
            ],
        }],
    })  # fmt: skip
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id, {"city": "Lisbon"})
    row = await harness.wait_for_status(run["id"], "COMPLETED", "FAILED")
    assert row["status"] == "COMPLETED", row["error"]
    assert len(seen) == 4
    return run["id"], seen


async def _failed_run(harness: Harness, workspace_id: str) -> str:
    async def reserve(ctx: Any) -> None:
        raise RuntimeError("inventory service returned 503: upstream timeout")

    harness.tasks.register("reserve_stock", reserve)
    def_id = await create_definition(harness.rt, workspace_id, {
        "name": "order-fulfilment", "version": "3",
        "steps": [{"type": "task", "name": "reserve", "handler": "reserve_stock",
                   "retry": {"maxAttempts": 1}}],
    })  # fmt: skip
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id, {"orderId": "ord_1042"})
    await harness.wait_for_status(run["id"], "FAILED")
    return run["id"]


def _json_texts(value: Any) -> list[str]:
    """The leaf values as the page prints them inside pretty JSON."""
    if isinstance(value, dict):
        return [t for v in value.values() for t in _json_texts(v)]
    if isinstance(value, list):
        return [t for v in value for t in _json_texts(v)]
    return [json.dumps(value, ensure_ascii=False)]


async def test_runs_list_tool_loop_trace_and_failed_run_are_readable_in_the_browser(
    harness: Harness, workspace_id: str, ui_server: UiServer, context: Any
) -> None:
    loop_run, seen = await _tool_loop_run(harness, workspace_id)
    failed_run = await _failed_run(harness, workspace_id)
    page = await context.new_page()
    await login(page, ui_server.api_key)

    # Runs list: both runs, their statuses, and the filter narrowing to one.
    table = page.locator("table.runs-table")
    await table.locator(f"a[href='/ui/runs/{loop_run}']").wait_for()
    assert "city-briefing" in await table.inner_text() and "order-fulfilment" in await table.inner_text()
    assert (
        await page.locator(".pill-completed").count() >= 1 and await page.locator(".pill-failed").count() >= 1
    )
    await screenshot(page, "01-runs-list")
    await page.select_option("select[name=status]", "FAILED")
    await page.wait_for_url("**status=FAILED**")
    assert await page.locator(f"a[href='/ui/runs/{failed_run}']").count() == 1
    assert await page.locator(f"a[href='/ui/runs/{loop_run}']").count() == 0

    # The tool loop: 4 model calls (3 with tools), every call's arguments and result visible.
    await page.goto(f"/ui/runs/{loop_run}")
    await page.locator(".run-header .pill-completed").wait_for()
    assert await page.locator(".round").count() == 4
    assert await page.locator(".toolcall").count() == 4
    for summary in await page.locator(".toolcall details.json > summary").all():
        await summary.click()  # long JSON starts collapsed; open it to read it
    body = await page.locator("main").inner_text()
    for args, result in seen:
        for text in _json_texts(args) + _json_texts(result):
            assert text in body, f"{text} not visible on the run page"
    assert FINAL_ANSWER in body
    assert "scripted-test" in body
    await page.locator(".tools-panel > summary").click()
    assert await page.locator(".tool-defs > li").count() == 3
    panel = await page.locator(".tools-panel").inner_text()
    assert "Current weather for a city." in panel and "Celsius to Fahrenheit." in panel
    await screenshot(page, "02-run-tool-loop")
    await page.set_viewport_size({"width": 420, "height": 900})
    await screenshot(page, "02b-run-tool-loop-narrow")
    await page.set_viewport_size({"width": 1280, "height": 900})

    # The failed run: the handler's error message in the header and on the step.
    await page.goto(f"/ui/runs/{failed_run}")
    await page.locator(".run-header .pill-failed").wait_for()
    header_error = await page.locator(".run-header .error-box").inner_text()
    assert "inventory service returned 503: upstream timeout" in header_error
    assert "inventory service returned 503" in await page.locator(".step-failed .error-box").inner_text()
    await screenshot(page, "03-run-failed")

    # Definitions list and page.
    await page.goto("/ui/definitions")
    await page.click("text=city-briefing")
    await page.locator(".def-step").first.wait_for()
    assert "get_weather, convert_temp, list_events" in await page.locator(".def-step").inner_text()
    await screenshot(page, "04-definition")


async def _approval_run(harness: Harness, workspace_id: str, name: str) -> tuple[str, str]:
    async def draft(ctx: Any) -> dict[str, Any]:
        return {
            "status": "completed",
            "stateUpdates": {"email": {"subject": "Welcome aboard!", "body": "Hi Ada, thanks for joining."}},
        }

    async def send(ctx: Any) -> dict[str, Any]:
        await asyncio.sleep(0.4)  # long enough to watch the run go RUNNING before COMPLETED
        return {"status": "completed", "output": {"sent": True}}

    harness.tasks.register("draft_email", draft)
    harness.tasks.register("send_email", send)
    def_id = await create_definition(harness.rt, workspace_id, {
        "name": name, "version": "1",
        "steps": [
            {"type": "task", "name": "draft", "handler": "draft_email"},
            {"type": "approval", "name": "review", "contentKey": "email",
             "prompt": "Check the welcome email before it goes out."},
            {"type": "task", "name": "send", "handler": "send_email"},
        ],
    })  # fmt: skip
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id, {"customer": "Ada"})
    await harness.wait_for_status(run["id"], "WAITING")
    approval_id = await harness.rt.pool.fetchval(
        "SELECT id FROM approval_requests WHERE workflow_run_id = $1 AND status = 'PENDING'", run["id"]
    )
    assert approval_id is not None
    return run["id"], approval_id


async def test_approving_from_the_inbox_continues_the_run_live_on_its_page(
    harness: Harness, workspace_id: str, ui_server: UiServer, context: Any
) -> None:
    run_id, approval_id = await _approval_run(harness, workspace_id, "welcome-email")
    edit_run, edit_approval = await _approval_run(harness, workspace_id, "welcome-email-edited")
    watcher = await context.new_page()
    await login(watcher, ui_server.api_key, f"/ui/runs/{run_id}")
    await watcher.locator(".run-header .pill-waiting").wait_for()
    assert "Waiting for a reviewer" in await watcher.locator(".step-waiting").inner_text()
    await watcher.evaluate("window.__notReloaded = true")
    await screenshot(watcher, "05a-run-waiting-for-approval")

    inbox = await context.new_page()
    await inbox.goto("/ui/approvals")
    card = inbox.locator(f"[data-approval-id='{approval_id}']")
    assert "Welcome aboard!" in await card.inner_text()
    assert "Check the welcome email before it goes out." in await card.inner_text()
    await screenshot(inbox, "05-approvals-inbox")
    await card.locator("button[value=approved]").click()
    await inbox.locator(".flash-ok").wait_for()
    assert approval_id in await inbox.locator(".flash-ok").inner_text()
    assert await inbox.locator(f"[data-approval-id='{approval_id}']").count() == 0

    # The watcher page follows over SSE: no reload, and the status ends COMPLETED.
    await watcher.locator(".run-header .pill-completed").wait_for(timeout=15_000)
    assert await watcher.evaluate("window.__notReloaded === true")
    # The page can show COMPLETED (its fragment reads the database) a poll before the last events
    # reach it over SSE; wait for them: APPROVAL_DECIDED .. WORKFLOW_COMPLETED arrive on the stream.
    await watcher.wait_for_function(
        "Number(document.getElementById('run-live').dataset.eventsSeen || 0) >= 5", timeout=10_000
    )
    events = await watcher.locator(".events-table").inner_text()
    assert "APPROVAL_DECIDED" in events and "WORKFLOW_COMPLETED" in events
    assert await watcher.locator(".live").count() == 0
    await screenshot(watcher, "06-run-approved-live")

    # Edit: the textarea's JSON replaces the state key and the run completes with it.
    edit_card = inbox.locator(f"[data-approval-id='{edit_approval}']")
    await edit_card.locator("details.edit > summary").click()
    edited = {"subject": "Welcome, Ada!", "body": "Edited by a reviewer."}
    await edit_card.locator("textarea").fill(json.dumps(edited))
    await screenshot(inbox, "07-approvals-edit")
    await edit_card.locator("button[type=submit].btn-primary").click()
    await inbox.locator(".flash-ok").wait_for()
    row = await harness.wait_for_status(edit_run, "COMPLETED", "FAILED")
    assert row["status"] == "COMPLETED" and row["state"]["email"] == edited


async def test_pages_need_a_valid_key_and_forms_need_the_csrf_token(
    harness: Harness, workspace_id: str, ui_server: UiServer, context: Any
) -> None:
    run_id, approval_id = await _approval_run(harness, workspace_id, "guarded")
    page = await context.new_page()
    await page.goto(f"/ui/runs/{run_id}")
    assert "/ui/login" in page.url
    await page.fill("input[name=key]", "stv_" + "x" * 32)
    await page.click("button[type=submit]")
    assert "unknown or revoked" in await page.locator(".flash-error").inner_text()
    await screenshot(page, "00-login")
    await page.fill("input[name=key]", ui_server.api_key)
    await page.click("button[type=submit]")
    await page.wait_for_url(f"**/ui/runs/{run_id}")

    forged = await page.request.post(
        f"/ui/approvals/{approval_id}/decide",
        form={"decision": "approved", "csrf": "0" * 64},
        max_redirects=0,
    )
    assert forged.status == 403
    status = await harness.rt.pool.fetchval("SELECT status FROM approval_requests WHERE id = $1", approval_id)
    assert status == "PENDING"

    await page.click("button:has-text('Log out')")
    await page.wait_for_url("**/ui/login")
    await page.goto("/ui/approvals")
    assert "/ui/login" in page.url


async def test_runs_list_pages_through_runs_and_filters_by_definition(
    harness: Harness, workspace_id: str, ui_server: UiServer, context: Any
) -> None:
    a = await create_definition(
        harness.rt,
        workspace_id,
        {"name": "nightly-sync", "version": "1", "steps": [{"type": "task", "name": "t", "handler": "h"}]},
    )
    b = await create_definition(
        harness.rt,
        workspace_id,
        {"name": "weekly-report", "version": "1", "steps": [{"type": "task", "name": "t", "handler": "h"}]},
    )
    # Finished runs written directly: the list only reads rows, no need to execute 30 runs.
    await harness.rt.pool.execute(
        "INSERT INTO workflow_runs (id, workspace_id, definition_id, status, started_at, completed_at, "
        "total_cost_cents, total_input_tokens, total_output_tokens, created_at) "
        "SELECT 'wfrun_page' || lpad(g::text, 3, '0'), $1, CASE WHEN g <= 28 THEN $2 ELSE $3 END, "
        "'COMPLETED', now() - interval '1 hour', now() - interval '1 hour' + g * interval '1 second', "
        "1.25 * g, 1000 * g, 100 * g, now() - interval '1 hour' + g * interval '1 minute' "
        "FROM generate_series(1, 30) g",
        workspace_id,
        a,
        b,
    )
    page = await context.new_page()
    await login(page, ui_server.api_key)
    assert await page.locator("table.runs-table tbody tr").count() == 25
    assert "Page 1 of 2 · 30 runs" in await page.locator(".pager").inner_text()
    first = page.locator("table.runs-table tbody tr").first
    assert "wfrun_page030" in await first.inner_text() and "$0.3750" in await first.inner_text()
    assert "30.0 s" in await first.inner_text()  # duration column
    await page.click("text=Older →")
    await page.wait_for_url("**page=2**")
    assert await page.locator("table.runs-table tbody tr").count() == 5
    await page.goto("/ui/runs")
    await page.select_option("select[name=definition]", b)
    await page.wait_for_url(f"**definition={b}**")
    assert await page.locator("table.runs-table tbody tr").count() == 2
    assert "Page 1 of 1 · 2 runs" in await page.locator(".pager").inner_text()
