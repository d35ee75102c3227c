"""A run's budget in the web UI (headless Chromium): the run page shows used / limit, and a person
raises the budget of a run that waits for it (`onBudgetExceeded: "pause"`); the run then finishes."""

from __future__ import annotations

from typing import Any

import pytest

from stevora.engine import commands
from tests.conftest import Harness, create_definition
from tests.e2e import ui_fixtures
from tests.e2e.ui_fixtures import UiServer, login, screenshot

pytestmark = pytest.mark.browser

chromium_path = ui_fixtures.chromium_path
browser = ui_fixtures.browser
ui_server = ui_fixtures.ui_server
context = ui_fixtures.context


async def test_a_person_raises_the_budget_of_a_paused_run_on_its_page(
    harness: Harness, workspace_id: str, ui_server: UiServer, context: Any
) -> None:
    ran: list[int] = []

    @harness.tools.tool
    async def lookup() -> str:
        """Look something up."""
        ran.append(1)
        return "found"

    def_id = await create_definition(harness.rt, workspace_id, {
        "name": "curious-agent", "version": "1",
        "budget": {"maxToolCalls": 2, "maxModelCalls": 20, "onBudgetExceeded": "pause"},
        "steps": [{"type": "llm", "name": "agent", "model": "scripted:rounds=4", "maxToolRounds": 4,
                   "tools": ["lookup"], "messages": [{"role": "user", "content": "Look it all up"}]}],
    })  # fmt: skip
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id, {})
    await harness.wait_for_status(run["id"], "WAITING")
    assert len(ran) == 2

    page = await context.new_page()
    await login(page, ui_server.api_key, f"/ui/runs/{run['id']}")
    budget = page.locator("#run-budget")
    assert "2 / 2" in await budget.locator("[data-limit=maxToolCalls]").inner_text()
    assert "3 / 20" in await budget.locator("[data-limit=maxModelCalls]").inner_text()
    assert await budget.locator("[data-limit=maxToolCalls] dd.over").count() == 1
    assert "pause for a raise" in await budget.inner_text()
    assert "Waiting for a person to raise the run's budget" in await page.locator(".step-note").inner_text()
    form = page.locator("details.budget-form")
    assert await form.get_attribute("open") is not None  # opened for the person who must act
    await screenshot(page, "20-run-waiting-for-a-budget-raise")

    form = page.locator("details.budget-form")
    await form.locator("input[name=maxToolCalls]").fill("10")
    await form.locator("button:has-text('Save budget')").click()
    await page.locator(".flash-ok").wait_for()
    assert "The run continues" in await page.locator(".flash-ok").inner_text()
    row = await harness.wait_for_status(run["id"], "COMPLETED", "FAILED")
    assert row["status"] == "COMPLETED", row["error"]
    assert len(ran) == 4 and row["budget"]["maxToolCalls"] == 10

    await page.goto(f"{ui_server.base_url}/ui/runs/{run['id']}")
    assert "4 / 10" in await page.locator("#run-budget [data-limit=maxToolCalls]").inner_text()
