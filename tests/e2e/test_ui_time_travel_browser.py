"""Time travel in headless Chromium: "Fork from here" at a round of a 5-round run, the fork form
(an edited tool result and state key, its mistakes named by field with nothing stored), the fork
running on the in-process worker against the fake model's SDK route, origin and fork linked both
ways, and the diff view marking the first divergence."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from stevora.engine import commands
from stevora.testing.fake_llm import FakeLLMServer
from stevora.tools import ToolContext
from tests.conftest import Harness, create_definition
from tests.e2e import ui_fixtures
from tests.e2e.ui_fixtures import UiServer, login, screenshot
from tests.integration.loop.conftest import SdkProviders, fake, fake_llm_session, llm_step, sdk  # noqa: F401
from tests.integration.loop.test_time_travel import _five_rounds, _round_of

pytestmark = pytest.mark.browser

chromium_path = ui_fixtures.chromium_path
browser = ui_fixtures.browser
ui_server = ui_fixtures.ui_server
context = ui_fixtures.context


async def _origin(harness: Harness, workspace_id: str, server: FakeLLMServer, ran: list[int]) -> str:
    """A completed run whose llm step asked `lookup(n)` in rounds 1-4 and answered in round 5."""

    @harness.tools.tool
    async def lookup(n: int, ctx: ToolContext) -> str:
        """Look n up."""
        ran.append(n)
        ctx.update_state({f"seen{n}": n, "last": n})
        return f"result {n}"

    _five_rounds(server)
    spec = {
        "name": "research-agent", "version": "1",
        "steps": [llm_step(tools=["lookup"], maxToolRounds=10, systemPrompt="You look things up.")],
    }  # fmt: skip
    def_id = await create_definition(harness.rt, workspace_id, spec)
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id, {"question": "go"})
    row = await harness.wait_for_status(run["id"], "COMPLETED", "FAILED")
    assert row["status"] == "COMPLETED", row["error"]
    return str(run["id"])


async def _run_count(harness: Harness) -> int:
    return await harness.rt.pool.fetchval("SELECT count(*) FROM workflow_runs")  # type: ignore[no-any-return]


async def test_fork_at_round_2_from_the_run_page_then_diff_with_the_origin(
    harness: Harness,
    workspace_id: str,
    ui_server: UiServer,
    context: Any,
    sdk: SdkProviders,  # noqa: F811
    fake: FakeLLMServer,  # noqa: F811
) -> None:
    ran: list[int] = []
    origin = await _origin(harness, workspace_id, fake, ran)
    assert ran == [1, 2, 3, 4]
    ran.clear()
    sent_before = len(fake.openai.requests)
    page = await context.new_page()
    await login(page, ui_server.api_key, f"/ui/runs/{origin}")

    # "Fork from here" on the step and on each of its five rounds.
    assert await page.locator(".step-head .fork-link").count() == 1
    assert [
        await a.get_attribute("data-fork-at") for a in await page.locator(".round-head .fork-link").all()
    ] == [f"agent:{r}" for r in range(1, 6)]
    await screenshot(page, "30-run-fork-from-here")
    await page.locator(".round-head .fork-link[data-fork-at='agent:2']").click()
    await page.locator("#fork-form").wait_for()
    assert "round 2 of step agent" in await page.locator("#fork-point").inner_text()
    # Round 1's call, whose result the model sees at round 2, is there to edit.
    assert json.loads(await page.input_value("#fork-result-call_1")) == "result 1"
    assert await page.locator(".fork-result").count() == 1

    # A mistake is named by its field, what was typed stays, nothing is stored.
    runs_before = await _run_count(harness)
    await page.fill("#fork-state", "flag=yes please")
    await page.fill("#fork-result-call_1", '"EDITED one"')
    await page.click("button[data-action=fork]")
    await page.locator("#fork-errors").wait_for()
    assert "edits.state.flag: not valid JSON" in await page.locator("#fork-errors").inner_text()
    assert await page.locator("#fork-state[aria-invalid=true]").count() == 1
    assert await page.input_value("#fork-result-call_1") == '"EDITED one"'
    await page.fill("#fork-state", "flag=true")
    await page.fill("#fork-model", "nomodel-x")
    await page.click("button[data-action=fork]")
    await page.locator("#fork-errors").wait_for()
    assert "edits.model: no provider is configured" in await page.locator("#fork-errors").inner_text()
    assert await page.locator("#fork-model[aria-invalid=true]").count() == 1
    await screenshot(page, "31-fork-form-error")
    assert await _run_count(harness) == runs_before

    await page.fill("#fork-model", "")
    await page.fill("#fork-state", 'flag=true\ntier="gold"')
    await screenshot(page, "32-fork-form")
    await page.click("button[data-action=fork]")
    await page.wait_for_url(re.compile(r".*/ui/runs/wfrun_[^/]+$"))
    fork_id = page.url.rsplit("/", 1)[-1]
    assert fork_id != origin and await _run_count(harness) == runs_before + 1
    assert f"Forked {origin} at step 'agent', round 2" in await page.locator(".flash-ok").inner_text()
    assert await page.locator("#forked-from a.mono").get_attribute("href") == f"/ui/runs/{origin}"

    # The fork runs on the worker: round 1 is never sent again nor its tool run, and the model's
    # first call (round 2) carries the edited result.
    row = await harness.wait_for_status(fork_id, "COMPLETED", "FAILED")
    assert row["status"] == "COMPLETED", row["error"]
    sent = [r.json for r in fake.openai.requests[sent_before:]]
    assert [_round_of(b) for b in sent] == [2, 3, 4, 5]
    assert [m["content"] for m in sent[0]["messages"] if m["role"] == "tool"] == ["EDITED one"]
    assert ran == [2, 3, 4]
    assert row["state"]["flag"] is True and row["state"]["tier"] == "gold"
    assert row["fork_edits"] == {
        "state": {"flag": True, "tier": "gold"},
        "toolResults": {"call_1": "EDITED one"},
    }

    # Linked both ways: the fork's page names its origin (round 1 inherited), the origin lists it.
    await page.goto(f"/ui/runs/{fork_id}")
    assert await page.locator(".round-head .tag", has_text="inherited").count() == 1
    assert "at step agent, round 2" in await page.locator("#forked-from").inner_text()
    # Its waterfall draws what it ran (rounds 2-5), not the copied round 1 on the origin's clock.
    assert await page.locator(".wf-model").count() == 4
    await screenshot(page, "34-fork-run-page")
    await page.goto(f"/ui/runs/{origin}")
    assert await page.locator(f"#run-forks [data-fork-id='{fork_id}'] a.mono").get_attribute("href") == (
        f"/ui/runs/{fork_id}"
    )

    # Compare with origin: five rounds aligned, the edited result of round 1 is the divergence.
    await page.goto(f"/ui/runs/{fork_id}")
    await page.click("#compare-origin")
    await page.wait_for_url(f"**/ui/diff?a={origin}&b={fork_id}")
    first = page.locator("#first-divergence")
    assert (await first.get_attribute("data-step"), await first.get_attribute("data-round")) == ("agent", "1")
    rows = page.locator("tr.diff-row")
    assert [await r.get_attribute("data-same") for r in await rows.all()] == ["false"] + ["true"] * 4
    marked = page.locator("tr.diff-first")
    assert await marked.count() == 1 and await marked.get_attribute("data-round") == "1"
    results = await marked.locator(".diff-results").all_inner_texts()
    assert '"result 1"' in results[0] and '"EDITED one"' in results[1]
    # Only the result that differs is highlighted, not the whole block; the same tool call is not.
    assert await marked.locator(".diff-results.differs").count() == 0
    assert await marked.locator(".diff-result.differs").count() == 2
    assert await marked.locator(".diff-call.differs").count() == 0
    # Run ids in the column headers keep their case (the headers are upper-cased labels).
    header_id = page.locator(".diff-table th .mono").first
    assert await header_id.evaluate("e => getComputedStyle(e).textTransform") == "none"
    assert await header_id.inner_text() == origin
    # B's round 1 is the origin's call copied (its result edited), not a call the fork made.
    assert await marked.locator("td.diff-side").nth(1).locator(".tag", has_text="inherited").count() == 1
    assert '{"n": 1}' in (await marked.locator(".diff-calls").all_inner_texts())[0]
    assert (
        f"{fork_id} is a fork of {origin} at step 'agent', round 2"
        in await page.locator("#diff-relation").inner_text()
    )
    await screenshot(page, "33-diff-view")


async def test_a_fork_point_that_does_not_exist_and_forged_posts_store_nothing(
    harness: Harness,
    workspace_id: str,
    ui_server: UiServer,
    context: Any,
    sdk: SdkProviders,  # noqa: F811
    fake: FakeLLMServer,  # noqa: F811
) -> None:
    origin = await _origin(harness, workspace_id, fake, [])
    runs_before = await _run_count(harness)
    page = await context.new_page()
    await login(page, ui_server.api_key, f"/ui/runs/{origin}/fork?at=agent:9")
    errors = await page.locator("#fork-errors").inner_text()
    assert "at: run " in errors and "no fork point at step 'agent' round 9" in errors
    assert await page.locator("#fork-form").count() == 0
    # The points that do exist are listed to pick from.
    assert [await a.get_attribute("data-at") for a in await page.locator("#fork-points a").all()] == [
        "agent",
        *(f"agent:{r}" for r in range(1, 6)),
    ]

    # Another version of the definition is offered for the fork (checked by the engine).
    spec = {"name": "research-agent", "version": "2", "steps": [llm_step(tools=["lookup"])]}
    await create_definition(harness.rt, workspace_id, spec)
    await page.goto(f"/ui/runs/{origin}/fork?at=agent:3")
    assert await page.locator("#fork-version option").all_inner_texts() == ["v1 (the run's)", "v2"]
    csrf = await page.locator("#fork-form input[name=csrf]").input_value()
    # Without the CSRF token: refused.
    forged = await page.request.post(
        f"/ui/runs/{origin}/fork", form={"at": "agent:3", "csrf": "0" * 64}, max_redirects=0
    )
    assert forged.status == 403
    # A result for a call of another round (a stale or hand-made form): named, nothing stored.
    stale = await page.request.post(
        f"/ui/runs/{origin}/fork",
        form={"at": "agent:3", "csrf": csrf, "result.call_1": '"x"'},
        max_redirects=0,
    )
    assert stale.status == 400 and "edits.toolResults.call_1" in await stale.text()
    bad_at = await page.request.post(
        f"/ui/runs/{origin}/fork", form={"at": "agent:x", "csrf": csrf}, max_redirects=0
    )
    assert bad_at.status == 400 and "expected &#39;STEP&#39; or &#39;STEP:ROUND&#39;" in await bad_at.text()
    assert await _run_count(harness) == runs_before

    # The diff view names an unknown run id.
    await page.goto(f"/ui/diff?a={origin}&b=wfrun_nope")
    assert "b: no run 'wfrun_nope' in this workspace" in await page.locator("#diff-errors").inner_text()
