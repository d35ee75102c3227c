"""The run page as a new user reads it (headless Chromium, screenshots in test-artifacts/): a run
waiting for a person has its call to action at the top, and approving it there leads on, not back
to the same page; the waterfall is above the fold and draws waits unlike compute; state is
readable JSON (a JSON text inside a string shown as JSON) and an output equal to it is not
repeated; a map step's items show each item's value and duration."""

from __future__ import annotations

import json
from typing import Any

import pytest

from stevora.engine import commands
from stevora.ids import new_id
from tests.conftest import Harness, create_definition
from tests.e2e import ui_fixtures
from tests.e2e.test_ui_new_user_browser import _gated_run
from tests.e2e.ui_fixtures import UiServer, login, screenshot

pytestmark = pytest.mark.browser

chromium_path = ui_fixtures.chromium_path
browser = ui_fixtures.browser
ui_server = ui_fixtures.ui_server
context = ui_fixtures.context


async def _top(page: Any, selector: str) -> float:
    box = await page.locator(selector).first.bounding_box()
    assert box is not None, selector
    return float(box["y"])


async def test_a_run_waiting_for_approval_has_its_call_to_action_at_the_top_and_waits_look_like_waits(
    harness: Harness, workspace_id: str, ui_server: UiServer, context: Any
) -> None:
    run_id = await _gated_run(harness, workspace_id)  # an approval-gated issue_refund call

    page = await context.new_page()
    await login(page, ui_server.api_key, f"/ui/runs/{run_id}")
    cta = page.locator("#run-approval-cta")
    assert "Waiting for your approval" in await cta.inner_text() and "issue_refund" in await cta.inner_text()
    viewport = page.viewport_size["height"]
    assert await _top(page, "#run-approval-cta") < 400  # in the header, not 1.5 screens down
    assert await _top(page, ".waterfall-section") < viewport  # above the fold
    assert await _top(page, ".waterfall-section") < await _top(page, ".io-section")
    # The approval being waited for is a wait bar, not a compute bar.
    wait_bar = page.locator(".wf-wait .wf-bar-wait")
    assert await wait_bar.count() >= 1
    style = await wait_bar.first.evaluate("e => getComputedStyle(e).borderTopStyle")
    assert style == "dashed"
    await screenshot(page, "40-run-waiting-for-approval-call-to-action")

    await cta.locator("button[data-action=cta-approve]").click()
    await page.wait_for_url(f"**/ui/runs/{run_id}")
    flash = page.locator(".flash-ok")
    await flash.wait_for()
    # Landing on the run page, the flash never links to the page already shown.
    links = [await a.get_attribute("href") for a in await flash.locator("a").all()]
    assert f"/ui/runs/{run_id}" not in links, links
    assert "No other approval is waiting" in await flash.inner_text()
    done = await harness.wait_for_status(run_id, "COMPLETED", "FAILED")
    assert done["status"] == "COMPLETED", done["error"]
    await page.goto(f"/ui/runs/{run_id}")
    assert await page.locator("#run-approval-cta").count() == 0
    assert "waiting for a person to approve" in await page.locator(".wf-wait").first.inner_text()
    await screenshot(page, "41-run-approved-waterfall-with-wait")


async def test_state_is_readable_json_and_an_output_equal_to_it_is_not_repeated(
    harness: Harness, workspace_id: str, ui_server: UiServer, context: Any
) -> None:
    async def answer(ctx: Any) -> dict[str, Any]:
        found = json.dumps({"articles": [{"id": "kb_1", "title": "Refunds"}], "total": 1})
        return {"status": "completed", "stateUpdates": {"search": found, "note": "done"}}

    harness.tasks.register("answer", answer)
    def_id = await create_definition(harness.rt, workspace_id, {
        "name": "json-state", "version": "1", "steps": [{"type": "task", "name": "a", "handler": "answer"}],
    })  # fmt: skip
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id, {})
    await harness.wait_for_status(run["id"], "COMPLETED")
    page = await context.new_page()
    await login(page, ui_server.api_key, f"/ui/runs/{run['id']}")
    state = await page.locator(".io-section .io-grid > div").nth(1).inner_text()
    assert '"title": "Refunds"' in state and '\\"' not in state, state  # the JSON text shown as JSON
    assert await page.locator("#run-output-same").count() == 1
    await screenshot(page, "42-run-state-readable-json")


async def test_a_map_steps_items_show_each_value_and_duration(
    harness: Harness, workspace_id: str, ui_server: UiServer, context: Any
) -> None:
    async def look(ctx: Any) -> dict[str, Any]:
        return {"status": "completed", "stateUpdates": {"seen": ctx.workflow_input["item"]}}

    harness.tasks.register("look", look)
    child = new_id("child")
    await create_definition(harness.rt, workspace_id, {
        "name": child, "version": "1", "steps": [{"type": "task", "name": "w", "handler": "look"}],
    })  # fmt: skip
    def_id = await create_definition(harness.rt, workspace_id, {
        "name": "map-page", "version": "1",
        "steps": [{"type": "map", "name": "fan", "items": "{{input.items}}", "workflow": child, "concurrency": 2}],
    })  # fmt: skip
    run, _ = await commands.create_run(
        harness.rt, workspace_id, def_id, {"items": ["alpha", "beta", "gamma"]}
    )
    await harness.wait_for_status(run["id"], "COMPLETED")
    page = await context.new_page()
    await login(page, ui_server.api_key, f"/ui/runs/{run['id']}")
    values = await page.locator(".map-items td.item-value").all_inner_texts()
    assert [("alpha" in v, "beta" in v, "gamma" in v) for v in values] == [
        (True, False, False), (False, True, False), (False, False, True)
    ]  # fmt: skip
    durations = await page.locator(".map-items td.item-duration").all_inner_texts()
    assert len(durations) == 3 and all(d.strip() not in ("", "—", "running") for d in durations), durations
    # The waterfall draws each item under the map step, not the step as one bar.
    assert await page.locator(".wf-item .wf-name").all_inner_texts() == ["item 0", "item 1", "item 2"]
    await screenshot(page, "43-map-step-items")
