"""`stevora rate-limits` (and `GET /v1/rate-limits` under it, through the Python client): each
configured provider limit and what the shared buckets hold reserved in its window."""

from __future__ import annotations

import json
import secrets

from stevora.engine import provider_limits
from stevora.settings import ProviderRateLimit
from tests.conftest import Harness
from tests.integration.cli.conftest import Cli


async def test_rate_limits_shows_each_limit_and_its_use_across_workers(cli: Cli, harness: Harness) -> None:
    key = f"scripted:limited-{secrets.token_hex(3)}"
    saved = harness.rt.settings
    harness.rt.settings = saved.model_copy(
        update={
            "rate_limits": {key: ProviderRateLimit(rpm=600, tpm=None), "openai": ProviderRateLimit(tpm=1000)}
        }
    )
    try:
        limits = provider_limits.of(harness.rt)  # 30 calls of 2,000 tokens reserved by "another worker"
        for _ in range(30):
            await limits.reserve(limits.budgets[key], 2000, 60)
        as_json = await cli("rate-limits", "--json")
        table = await cli("rate-limits")
    finally:
        harness.rt.settings = saved
    assert as_json.exit_code == 0, as_json.output
    by_key = {item["key"]: item for item in json.loads(as_json.output)}
    assert set(by_key) == {key, "openai"}
    limited = by_key[key]
    assert limited["requests"]["limit"] == 600 and limited["tokens"] is None
    # 30 requests reserved, less the refill since (10 a second at 600 per 60 s).
    assert 20 <= limited["requests"]["used"] <= 30, limited
    assert limited["windowS"] == 60 and limited["inForce"] == 1
    assert by_key["openai"]["requests"] is None
    assert by_key["openai"]["tokens"] == {"used": 0, "limit": 1000}  # never used: nothing reserved

    assert table.exit_code == 0, table.output
    line = next(line for line in table.output.splitlines() if line.startswith(key))
    assert "requests" in line and "/ 600" in line and "tokens not limited" in line and "per 60 s" in line


async def test_without_limits_it_says_none_are_configured(cli: Cli) -> None:
    table = await cli("rate-limits")
    assert table.exit_code == 0 and "no provider rate limits configured (STEVORA_RATE_LIMITS)" in table.output
    as_json = await cli("rate-limits", "--json")
    assert json.loads(as_json.output) == []
