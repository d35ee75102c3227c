"""A fork that runs another version of its run's definition from the fork point on
(`edits.definitionVersion`), through the HTTP API, the real driver and the fake model's SDK route."""

from __future__ import annotations

from typing import Any

import httpx

from stevora.testing.fake_llm import FakeLLMServer
from tests.conftest import Harness
from tests.integration.loop.conftest import SdkProviders, llm_step
from tests.integration.loop.test_time_travel import _five_rounds, api, side_effects  # noqa: F401

Api = tuple[httpx.AsyncClient, dict[str, str]]


async def _define(client: httpx.AsyncClient, headers: dict[str, str], version: str, steps: list[Any]) -> str:
    made = await client.post(
        "/v1/workflow-definitions",
        json={"name": "tt-versions", "version": version, "steps": steps},
        headers=headers,
    )
    assert made.status_code == 201, made.text
    return str(made.json()["data"]["id"])


async def test_a_fork_runs_the_named_version_from_the_fork_point_and_a_bad_one_is_named(
    harness: Harness,
    sdk: SdkProviders,
    fake: FakeLLMServer,
    api: Api,  # noqa: F811
    side_effects: list[int],  # noqa: F811
) -> None:
    client, headers = api
    notified: list[Any] = []

    async def notify(ctx: Any) -> dict[str, Any]:
        notified.append(ctx.workflow_state.get("last"))
        return {"status": "completed", "output": {"notified": True}}

    harness.tasks.register("notify", notify)
    _five_rounds(fake)
    agent = llm_step(tools=["lookup"], maxToolRounds=10)
    v1 = await _define(client, headers, "1", [agent, {"type": "wait", "name": "after", "durationMs": 1}])
    v2 = await _define(client, headers, "2", [agent, {"type": "task", "name": "notify", "handler": "notify"}])
    await _define(client, headers, "3-moved", [{"type": "wait", "name": "first", "durationMs": 1}, agent])
    await _define(client, headers, "4-typed", [{"type": "wait", "name": "agent", "durationMs": 1}])
    created = await client.post(
        "/v1/workflow-runs", json={"definitionId": v1, "input": {"question": "go"}}, headers=headers
    )
    origin = created.json()["data"]["id"]
    assert (await harness.wait_for_status(origin, "COMPLETED", "FAILED"))["status"] == "COMPLETED"
    assert notified == []

    count = await harness.rt.pool.fetchval("SELECT count(*) FROM workflow_runs")
    for version, message in (
        ("9", "definition 'tt-versions' has no version '9'"),
        ("3-moved", "at position 2 in version '3-moved', a llm step at position 1"),
        ("4-typed", "is a wait step at position 1 in version '4-typed'"),
        ("", "must be a version"),
    ):
        body = {"at": "agent:3", "edits": {"definitionVersion": version}}
        got = await client.post(f"/v1/workflow-runs/{origin}/fork", json=body, headers=headers)
        assert got.status_code == 400, got.text
        problem = got.json()["error"]["details"]["errors"][0]
        assert problem["path"] == "edits.definitionVersion" and message in problem["message"], problem
    assert await harness.rt.pool.fetchval("SELECT count(*) FROM workflow_runs") == count

    body = {"at": "agent:3", "edits": {"definitionVersion": "2"}}
    made = await client.post(f"/v1/workflow-runs/{origin}/fork", json=body, headers=headers)
    assert made.status_code == 201, made.text
    fork = made.json()["data"]
    assert fork["definitionId"] == v2 and fork["edits"] == {"definitionVersion": "2"}
    row = await harness.wait_for_status(fork["id"], "COMPLETED", "FAILED")
    assert row["status"] == "COMPLETED", row["error"]
    assert notified == [4]  # version 2's step after the agent ran, not version 1's wait
    steps = await harness.rt.pool.fetch(
        "SELECT step_name FROM step_runs WHERE workflow_run_id = $1 ORDER BY created_at, step_index",
        fork["id"],
    )
    assert [s["step_name"] for s in steps] == ["agent", "notify"]

    # With a model edit too: a derived version of version 2.
    body = {"at": "agent:3", "edits": {"definitionVersion": "2", "model": "gpt-4.1-mini"}}
    made = await client.post(f"/v1/workflow-runs/{origin}/fork", json=body, headers=headers)
    assert made.status_code == 201, made.text
    version = await harness.rt.pool.fetchval(
        "SELECT version FROM workflow_definitions WHERE id = $1", made.json()["data"]["definitionId"]
    )
    assert version.startswith("2+fork-")
    assert (await harness.wait_for_status(made.json()["data"]["id"], "COMPLETED", "FAILED"))[
        "status"
    ] == "COMPLETED"
    assert fake.openai.requests[-1].json["model"] == "gpt-4.1-mini"
