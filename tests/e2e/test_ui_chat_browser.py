"""The chat page in headless Chromium (issue 33): "New chat" on a definition, send a message,
watch the answer's tokens stream into a bubble, and double-text a working turn with each policy
(reject, steer, enqueue, interrupt). Screenshots in test-artifacts/screenshots/."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from stevora.ids import new_id
from stevora.llm.messages import LlmResponse, ToolCall, Usage
from tests.conftest import Harness, create_definition
from tests.e2e import ui_fixtures
from tests.e2e.ui_fixtures import UiServer, login, screenshot

pytestmark = pytest.mark.browser

chromium_path = ui_fixtures.chromium_path
browser = ui_fixtures.browser
ui_server = ui_fixtures.ui_server
context = ui_fixtures.context

ANSWER = "Hello! Your order o-1 shipped yesterday and arrives on Friday, by noon at the latest."


def said(text: str | None = None, call: str | None = None) -> LlmResponse:
    return LlmResponse(
        text=text,
        tool_calls=[ToolCall(new_id("call"), call, "{}")] if call else [],
        usage=Usage(10, 5),
        model="scripted",
        finish_reason="tool_calls" if call else "stop",
        response_id=None,
        provider="scripted",
    )


async def send(page: Any, text: str, policy: str | None = None) -> None:
    await page.fill("#chat-content", text)
    if policy is not None:
        await page.check(f"input[name=on_active][value={policy}]")
    await page.click("#chat-send")
    await page.wait_for_load_state()


async def test_chat_page_streams_tokens_and_double_texts_with_each_policy(
    harness: Harness, workspace_id: str, ui_server: UiServer, context: Any
) -> None:
    gates = [asyncio.Event(), asyncio.Event()]

    async def hold(input: dict[str, Any]) -> dict[str, str]:
        await gates.pop(0).wait()
        return {"order": "o-1", "status": "shipped"}

    harness.tools.register("hold", hold, parameters={"type": "object", "properties": {}})
    harness.scripted.latency_s = 1.6  # the answer streams in pieces over about a second
    harness.scripted.enqueue(
        said(call="hold"),  # turn 1: a tool that waits for the test
        said(ANSWER),  # ... then its answer, streamed
        said(call="hold"),  # turn 2 (enqueued): waits again, and is interrupted
        said("Stopped, as you asked."),  # turn 3 (the interrupting message)
    )
    def_id = await create_definition(harness.rt, workspace_id, {
        "name": "support-chat", "version": "1",
        "steps": [{"type": "llm", "name": "agent", "model": "scripted", "systemPrompt": "You help.",
                   "messages": [{"role": "user", "content": "{{input.content}}"}], "tools": ["hold"]}],
    })  # fmt: skip
    page = await context.new_page()
    await login(page, ui_server.api_key, f"/ui/definitions/{def_id}")
    await page.click("#new-chat-button")
    await page.wait_for_url("**/ui/threads/thr_*")
    thread_id = page.url.rsplit("/", 1)[-1]

    await send(page, "Where is my order o-1?")
    await page.locator("#policies").wait_for()  # a turn is running: the double-texting choice
    assert await page.locator(".bubble-user").count() == 1
    await screenshot(page, "chat-01-turn-working")

    await send(page, "Hello?", "reject")
    assert "THREAD_BUSY" in await page.locator(".flash").inner_text()
    await screenshot(page, "chat-02-reject")

    await send(page, "Also tell me when it arrives", "steer")
    assert "running turn" in await page.locator(".flash").inner_text()
    await screenshot(page, "chat-03-steer")

    await send(page, "And my other order?", "enqueue")
    assert "Queued" in await page.locator(".flash").inner_text()
    await page.locator("#queued").wait_for()
    await screenshot(page, "chat-04-enqueue")

    # Every text the live bubble shows is recorded as it changes (in sessionStorage, which outlives
    # the reload at the turn's end): the answer streams for about a second, and on a loaded machine
    # a poll from here could miss that window entirely.
    await page.evaluate(
        """() => {
        sessionStorage.setItem("liveSeen", "[]");
        const text = document.getElementById("live-text");
        new MutationObserver(() => {
            const seen = JSON.parse(sessionStorage.getItem("liveSeen"));
            seen.push(text.textContent);
            sessionStorage.setItem("liveSeen", JSON.stringify(seen));
        }).observe(text, {childList: true, characterData: true, subtree: true});
    }"""
    )
    gates[0].set()  # the first turn's tool returns; its answer streams
    for _ in range(200):
        seen = [
            t
            for t in await page.evaluate("() => JSON.parse(sessionStorage.getItem('liveSeen') || '[]')")
            if t
        ]
        if seen:
            break
        await asyncio.sleep(0.05)
    partial = seen[0] if seen else ""
    assert partial and ANSWER.startswith(partial) and partial != ANSWER
    await screenshot(page, "chat-05-live-tokens")

    # The page reloads when the turn ends; then the queued turn runs (and holds).
    await page.locator(".bubble-assistant:not(.bubble-live) .bubble-text", has_text=ANSWER).wait_for(
        timeout=20_000
    )
    await page.locator("#policies").wait_for(timeout=20_000)
    await send(page, "Stop that", "interrupt")
    # The interrupting turn may already have answered (and the page reloaded without the notice).
    await screenshot(page, "chat-06-interrupt")
    await page.locator(
        ".bubble-assistant:not(.bubble-live) .bubble-text", has_text="Stopped, as you asked."
    ).wait_for(timeout=20_000)
    await screenshot(page, "chat-07-interrupted-then-answered")

    users = [t.strip() for t in await page.locator(".bubble-user .bubble-text").all_inner_texts()]
    assert users == [
        "Where is my order o-1?",
        "Also tell me when it arrives",
        "And my other order?",
        "Stop that",
    ]
    steered = page.locator(".bubble-user", has_text="Also tell me when it arrives")
    assert "steered into round 2" in await steered.inner_text()
    # Each bubble links to its turn's run timeline.
    runs = await harness.rt.pool.fetch(
        "SELECT id, status, error FROM workflow_runs WHERE thread_id = $1 ORDER BY created_at", thread_id
    )
    assert [r["status"] for r in runs] == ["COMPLETED", "CANCELLED", "COMPLETED"]
    assert runs[1]["error"]["reason"] == "interrupted"
    assert "cancelled" in await page.locator(".bubble-user", has_text="And my other order?").inner_text()
    href = await page.locator(".bubble-user .turn-link").first.get_attribute("href")
    assert href == f"/ui/runs/{runs[0]['id']}"
    harness.scripted.latency_s = 0.0
