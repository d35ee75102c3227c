"""The UI of the provider rate limits: the runs page's panel of current use per model, and the
wait for a turn on the run page's model call."""

from __future__ import annotations

import re
import secrets

import httpx
from api_helpers import Tenant

from stevora.engine import provider_limits
from stevora.settings import ProviderRateLimit
from stevora.ui.auth import COOKIE_NAME
from tests.conftest import Harness


async def test_the_runs_page_shows_each_limit_in_use_and_the_run_page_the_wait(
    client: httpx.AsyncClient, tenant: Tenant, harness: Harness
) -> None:
    model = f"scripted:limited-{secrets.token_hex(3)}"
    harness.rt.settings = harness.rt.settings.model_copy(
        update={"rate_limits": {f"scripted:{model}": ProviderRateLimit(rpm=600, tpm=100_000)}}
    )
    body = {
        "name": "limited",
        "version": "1",
        "steps": [
            {"type": "llm", "name": "ask", "model": model, "messages": [{"role": "user", "content": "hi"}]}
        ],
    }
    created = await client.post("/v1/workflow-definitions", json=body, headers=tenant.headers)
    definition_id = created.json()["data"]["id"]
    run = await client.post(
        "/v1/workflow-runs", json={"definitionId": definition_id, "input": {}}, headers=tenant.headers
    )
    run_id = run.json()["data"]["id"]
    await harness.wait_for_status(run_id, "COMPLETED")
    limits = provider_limits.of(harness.rt)  # 50 more calls of 1,000 tokens, from "another worker"
    for _ in range(50):
        await limits.reserve(limits.budgets[f"scripted:{model}"], 1000, 60)
    client.cookies.set(COOKIE_NAME, tenant.key)
    try:
        listing = await client.get("/ui/runs")
        page = await client.get(f"/ui/runs/{run_id}")
    finally:
        client.cookies.delete(COOKIE_NAME)
    assert "Provider rate limits" in listing.text
    row = listing.text.split(f"scripted:{model}</td>", 1)[1].split("</tr>", 1)[0]
    requests, tokens = (int(n) for n in re.findall(r"<td>(\d+) / \d+", row))
    # 51 requests and 50,000+ tokens reserved, less the refill since (10 requests a second).
    assert 40 <= requests <= 51 and 40_000 <= tokens <= 51_000, row
    assert "/ 600<" in row and "/ 100000<" in row and "100%" in row
    assert "rate limit wait" in page.text


async def test_without_limits_the_runs_page_has_no_panel(client: httpx.AsyncClient, tenant: Tenant) -> None:
    client.cookies.set(COOKIE_NAME, tenant.key)
    try:
        listing = await client.get("/ui/runs")
    finally:
        client.cookies.delete(COOKIE_NAME)
    assert listing.status_code == 200 and "Provider rate limits" not in listing.text
