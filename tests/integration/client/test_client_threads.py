"""`client.threads` and `client.store` (issue 33) against the app in-process and behind a real
server: create, send, stream a turn's events across a reconnect, read the conversation."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from stevora.client import AgentRuntime, AsyncAgentRuntime
from stevora.client.errors import Conflict
from stevora.client.threads import TextDelta
from tests.conftest import Harness, create_definition


def chat_definition(**llm: Any) -> dict[str, Any]:
    return {
        "name": "chat",
        "version": "1",
        "steps": [
            {
                "type": "llm",
                "name": "agent",
                "model": "scripted",
                "messages": [{"role": "user", "content": "{{input.content}}"}],
                **llm,
            }
        ],
    }


async def test_threads_through_the_async_client_and_a_real_server(
    server_url: str, api_key: str, harness: Harness, workspace_id: str
) -> None:
    # A real server: the thread stream does not end on its own, which the in-process transport
    # (it reads a response whole) cannot carry.
    async with AsyncAgentRuntime(api_key, base_url=server_url) as client:
        await _async_client_story(client, harness, workspace_id)


async def _async_client_story(client: AsyncAgentRuntime, harness: Harness, workspace_id: str) -> None:
    await create_definition(harness.rt, workspace_id, chat_definition())
    thread = await client.threads.create(definition_name="chat", metadata={"user": "u_1"})
    first = await client.threads.send(thread.id, "Hello there")
    assert first.policy == "start"
    events = [e async for e in client.threads.stream(thread.id, until_run_ends=first.run_id)]
    assert events[-1].event_type == "WORKFLOW_COMPLETED"
    assert {e.workflow_run_id for e in events} == {first.run_id}
    second = await client.threads.send(thread.id, "Again")
    # Resuming after the first turn's last event: only the second turn's events follow.
    last = f"{events[-1].workflow_run_id}:{events[-1].sequence}"
    later = [e async for e in client.threads.stream(thread.id, last, until_run_ends=second.run_id)]
    assert {e.workflow_run_id for e in later} == {second.run_id}
    assert later[0].sequence == 1
    said = await client.threads.messages(thread.id)
    assert [(m.role, m.run_id) for m in said] == [
        ("user", first.run_id),
        ("assistant", first.run_id),
        ("user", second.run_id),
        ("assistant", second.run_id),
    ]
    found = await client.threads.list(metadata={"user": "u_1"})
    assert [t.id for t in found.data] == [thread.id]
    await client.store.put(["users", "u_1"], "prefs", {"drink": "coffee"})
    assert (await client.store.get("users.u_1", "prefs")).value == {"drink": "coffee"}
    hits = await client.store.search(["users"], "coffee")
    assert [(h.namespace, h.key) for h in hits.data] == [(["users", "u_1"], "prefs")]


async def test_threads_through_the_sync_client_and_a_real_server(
    server_url: str, api_key: str, harness: Harness, workspace_id: str
) -> None:
    await asyncio.to_thread(_sync_client_story, server_url, api_key)


def _sync_client_story(server_url: str, api_key: str) -> None:
    with AgentRuntime(api_key, base_url=server_url) as rt:
        definition = rt.definitions.apply(chat_definition(model="scripted"))
        thread = rt.threads.create(definition.id, on_active="reject")
        sent = rt.threads.send(thread.id, "Hi")
        items = list(rt.threads.stream(thread.id, until_run_ends=sent.run_id, text=True))
        assert items[-1].event_type == "WORKFLOW_COMPLETED"  # type: ignore[union-attr]
        assert all(not isinstance(i, TextDelta) or i.run_id == sent.run_id for i in items)
        assert rt.threads.get(thread.id).active_run_id is None
        rt.threads.delete(thread.id)


@pytest.mark.parametrize("policy", ["reject"])
async def test_a_busy_thread_refuses_with_conflict(
    client: AsyncAgentRuntime, harness: Harness, workspace_id: str, policy: str
) -> None:
    harness.scripted.latency_s = 1.0
    try:
        await create_definition(harness.rt, workspace_id, chat_definition())
        thread = await client.threads.create(definition_name="chat")
        first = await client.threads.send(thread.id, "slow one")
        with pytest.raises(Conflict) as busy:
            await client.threads.send(thread.id, "are you there", on_active=policy)  # type: ignore[arg-type]
        assert first.run_id in str(busy.value)
    finally:
        harness.scripted.latency_s = 0.0
