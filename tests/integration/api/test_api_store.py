"""The memory store (issue 33): tools write with `ctx.store` as part of their call's checkpoint
(a failed call writes nothing), a later thread reads and searches what an earlier one wrote, and
the API reads, writes, deletes and searches the same documents, per workspace."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from api_helpers import Tenant
from test_api_threads import chat, said, thread
from test_api_tool_outputs import wait_for
from test_api_toolboxes import turn
from test_api_workflow_tools import defined

from stevora.tools import ToolContext
from tests.conftest import Harness


@pytest.fixture
def memory_tools(harness: Harness) -> list[Any]:
    seen: list[Any] = []

    async def remember(input: dict[str, Any], ctx: ToolContext) -> dict[str, str]:
        await ctx.store.put(["users", "u_42"], "prefs", {"drink": input["drink"], "note": "likes it hot"})
        assert await ctx.store.get(["users", "u_42"], "prefs") == {
            "drink": input["drink"],
            "note": "likes it hot",
        }
        return {"saved": input["drink"]}

    async def recall(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        found = await ctx.store.search(["users"], input["query"])
        seen.append([(i.namespace, i.key, i.value) for i in found])
        return {"value": await ctx.store.get("users.u_42", "prefs")}

    async def remember_then_fail(input: dict[str, Any], ctx: ToolContext) -> None:
        await ctx.store.put(["users", "u_42"], "broken", {"x": "y"})
        raise RuntimeError("the call fails after writing")

    props = {"type": "object", "properties": {"drink": {"type": "string"}, "query": {"type": "string"}}}
    harness.tools.register("remember", remember, parameters=props)
    harness.tools.register("recall", recall, parameters=props)
    harness.tools.register("remember_then_fail", remember_then_fail, parameters=props)
    return seen


async def test_a_later_thread_reads_what_a_tool_stored_and_a_failed_call_stores_nothing(
    client: httpx.AsyncClient, tenant: Tenant, other_tenant: Tenant, harness: Harness, memory_tools: list[Any]
) -> None:
    definition_id = await defined(client, tenant, chat("remember", "recall", "remember_then_fail"))
    harness.scripted.enqueue(
        turn(("remember", {"drink": "green tea"})),
        turn(("remember_then_fail", {})),
        turn(),
        turn(("recall", {"query": "tea"})),
        turn(),
    )
    first = await said(client, tenant, await thread(client, tenant, definition_id), "I like green tea")
    assert (await wait_for(client, tenant, first, "COMPLETED", "FAILED"))["status"] == "COMPLETED"
    second = await said(client, tenant, await thread(client, tenant, definition_id), "What do I like?")
    assert (await wait_for(client, tenant, second, "COMPLETED", "FAILED"))["status"] == "COMPLETED"
    assert memory_tools == [[(("users", "u_42"), "prefs", {"drink": "green tea", "note": "likes it hot"})]]
    assert '"green tea"' in (harness.scripted.requests[-1].messages[-1].content or "")
    got = await client.get("/v1/store/users.u_42/prefs", headers=tenant.headers)
    assert got.status_code == 200 and got.json()["data"]["value"]["drink"] == "green tea"
    assert got.json()["data"]["namespace"] == ["users", "u_42"]
    # The failed call's write never landed.
    assert (await client.get("/v1/store/users.u_42/broken", headers=tenant.headers)).status_code == 404
    # Another workspace sees nothing.
    assert (await client.get("/v1/store/users.u_42/prefs", headers=other_tenant.headers)).status_code == 404
    found = await client.get("/v1/store/users?q=hot", headers=other_tenant.headers)
    assert found.json()["data"] == []


async def test_the_api_puts_gets_searches_and_deletes_documents(
    client: httpx.AsyncClient, tenant: Tenant
) -> None:
    h = tenant.headers
    for key, text in [("a", "the quick brown fox"), ("b", "a lazy dog sleeps"), ("c", "quick thinking")]:
        put = await client.put(f"/v1/store/notes.team/{key}", json={"value": {"text": text}}, headers=h)
        assert put.status_code == 200, put.text
    await client.put("/v1/store/other/x", json={"value": {"text": "quick"}}, headers=h)
    found = (await client.get("/v1/store/notes?q=quick", headers=h)).json()
    assert sorted(i["key"] for i in found["data"]) == ["a", "c"] and found["meta"]["total"] == 2
    assert all(i["score"] > 0 for i in found["data"])
    assert [
        i["key"] for i in (await client.get("/v1/store/notes?q=fox -lazy", headers=h)).json()["data"]
    ] == ["a"]
    listed = (await client.get("/v1/store/notes.team", headers=h)).json()
    assert listed["meta"]["total"] == 3
    again = await client.put("/v1/store/notes.team/a", json={"value": {"text": "slow"}}, headers=h)
    assert again.json()["data"]["value"] == {"text": "slow"}
    assert (await client.get("/v1/store/notes?q=fox", headers=h)).json()["data"] == []
    assert (await client.delete("/v1/store/notes.team/a", headers=h)).status_code == 200
    assert (await client.get("/v1/store/notes.team/a", headers=h)).status_code == 404
    bad = await client.put("/v1/store/bad%20space/k", json={"value": {}}, headers=h)
    assert bad.status_code == 400 and bad.json()["error"]["details"]["errors"][0]["path"] == "namespace"
    not_object = await client.put("/v1/store/ok/k", json={"value": [1]}, headers=h)
    assert not_object.status_code == 400 and "value" in not_object.text
