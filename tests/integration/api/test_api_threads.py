"""Threads (issue 33): turns carry the conversation, state and prompt-cache key across runs;
messages sent while a turn works follow the thread's (or the message's) `onActive` policy.
Through the API, with the in-process workers of the harness and the scripted provider."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from api_helpers import Tenant
from test_api_tool_outputs import wait_for
from test_api_toolboxes import turn
from test_api_workflow_tools import defined

from stevora.db import checkpoints
from stevora.db import runs as runs_db
from stevora.db import threads as db_threads
from stevora.engine.steps.llm_state import rebuild
from stevora.engine.steps.llm_thread import histories_for
from stevora.ids import new_id
from stevora.llm.messages import LlmRequest
from stevora.tools import ToolContext
from tests.conftest import Harness


def chat(*tools: str, **llm: Any) -> dict[str, Any]:
    return {
        "name": new_id("chat"),
        "steps": [
            {
                "type": "llm",
                "name": "agent",
                "model": "scripted",
                "systemPrompt": "You help with orders.",
                "messages": [{"role": "user", "content": "{{input.content}}"}],
                "tools": [{"name": t} for t in tools],
                **llm,
            }
        ],
    }


@pytest.fixture
def gate(harness: Harness) -> asyncio.Event:
    """`slow` blocks until the gate opens; `lookup` answers at once and notes a state key."""
    opened = asyncio.Event()

    async def slow(input: dict[str, Any]) -> dict[str, str]:
        await opened.wait()
        return {"slow": "done"}

    def lookup(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        ctx.update_state({"looked_up": input.get("order", "?")})
        return {"order": input.get("order"), "status": "shipped"}

    harness.tools.register("slow", slow, parameters={"type": "object", "properties": {}})
    harness.tools.register(
        "lookup", lookup, parameters={"type": "object", "properties": {"order": {"type": "string"}}}
    )
    return opened


async def thread(client: httpx.AsyncClient, tenant: Tenant, definition_id: str, **extra: Any) -> str:
    response = await client.post(
        "/v1/threads", json={"definitionId": definition_id, **extra}, headers=tenant.headers
    )
    assert response.status_code == 201, response.text
    thread_id: str = response.json()["data"]["id"]
    return thread_id


async def say(
    client: httpx.AsyncClient, tenant: Tenant, thread_id: str, content: str, **extra: Any
) -> httpx.Response:
    return await client.post(
        f"/v1/threads/{thread_id}/messages", json={"content": content, **extra}, headers=tenant.headers
    )


async def said(client: httpx.AsyncClient, tenant: Tenant, thread_id: str, content: str, **extra: Any) -> str:
    response = await say(client, tenant, thread_id, content, **extra)
    assert response.status_code == 201, response.text
    run_id: str = response.json()["data"]["runId"]
    return run_id


def wire(request: LlmRequest) -> list[str]:
    """The request's messages as the bytes a provider would get (JSON of each message)."""
    return [json.dumps(m.to_dict(), ensure_ascii=False) for m in request.messages]


async def requested_until(harness: Harness, count: int) -> list[LlmRequest]:
    for _ in range(500):
        if len(harness.scripted.requests) >= count:
            return list(harness.scripted.requests)
        await asyncio.sleep(0.02)
    raise AssertionError(f"{len(harness.scripted.requests)} model requests, wanted {count}")


async def test_second_turn_sends_the_first_exchange_byte_for_byte_then_its_message(
    client: httpx.AsyncClient, tenant: Tenant, harness: Harness, gate: asyncio.Event
) -> None:
    definition_id = await defined(client, tenant, chat("lookup"))
    thread_id = await thread(client, tenant, definition_id, metadata={"user": "u_42"}, state={"tier": "gold"})
    harness.scripted.enqueue(turn(("lookup", {"order": "o-1"})), turn(), turn())
    before = len(harness.scripted.requests)
    first = await said(client, tenant, thread_id, "Where is o-1?")
    assert (await wait_for(client, tenant, first, "COMPLETED", "FAILED"))["status"] == "COMPLETED"
    second = await said(client, tenant, thread_id, "And when does it arrive?")
    done = await wait_for(client, tenant, second, "COMPLETED", "FAILED")
    assert done["status"] == "COMPLETED"
    requests = list(harness.scripted.requests)[before:]
    assert len(requests) == 3
    last_of_first, first_of_second = requests[1], requests[2]
    # Everything the first turn sent, then its answer, then the new message: same bytes.
    assert wire(first_of_second)[: len(wire(last_of_first))] == wire(last_of_first)
    tail = first_of_second.messages[len(last_of_first.messages) :]
    assert [(m.role, m.content) for m in tail] == [
        ("assistant", "done"),
        ("user", "And when does it arrive?"),
    ]
    assert [m.role for m in first_of_second.messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
    ]
    # One prompt-cache key for the whole thread.
    assert {r.cache_key for r in requests} == {thread_id}
    # The state carries over: the first turn's tool wrote it, the second turn starts from it.
    assert done["state"]["looked_up"] == "o-1" and done["state"]["tier"] == "gold"
    got = (await client.get(f"/v1/threads/{thread_id}", headers=tenant.headers)).json()["data"]
    assert got["state"]["looked_up"] == "o-1" and got["activeRunId"] is None
    listed = (await client.get(f"/v1/threads/{thread_id}/messages", headers=tenant.headers)).json()["data"]
    assert [(m["role"], m["runId"]) for m in listed] == [
        ("user", first),
        ("assistant", first),
        ("tool", first),
        ("assistant", first),
        ("user", second),
        ("assistant", second),
    ]
    assert listed[0]["content"] == "Where is o-1?" and listed[4]["content"] == "And when does it arrive?"
    assert listed[1]["toolCalls"][0]["name"] == "lookup"


async def test_threads_are_listed_by_metadata_and_private_to_their_workspace(
    client: httpx.AsyncClient, tenant: Tenant, other_tenant: Tenant
) -> None:
    definition_id = await defined(client, tenant, chat())
    mine = await thread(client, tenant, definition_id, metadata={"user": "u_1"})
    await thread(client, tenant, definition_id, metadata={"user": "u_2"})
    found = await client.get("/v1/threads?metadata.user=u_1", headers=tenant.headers)
    assert [t["id"] for t in found.json()["data"]] == [mine]
    assert found.json()["meta"]["total"] == 1
    for method, path, body in [
        ("GET", f"/v1/threads/{mine}", None),
        ("GET", f"/v1/threads/{mine}/messages", None),
        ("POST", f"/v1/threads/{mine}/messages", {"content": "hi"}),
        ("GET", f"/v1/threads/{mine}/stream", None),
        ("DELETE", f"/v1/threads/{mine}", None),
    ]:
        response = await client.request(method, path, json=body, headers=other_tenant.headers)
        assert response.status_code == 404, (path, response.text)
    assert (await client.get("/v1/threads", headers=other_tenant.headers)).json()["data"] == []
    bad = await client.post("/v1/threads", json={"definitionId": definition_id}, headers=other_tenant.headers)
    assert bad.status_code == 404
    too_long = await say(client, tenant, mine, "x" * 32_001)
    assert too_long.status_code == 400 and "content" in too_long.text


async def test_reject_answers_409_naming_the_active_run(
    client: httpx.AsyncClient, tenant: Tenant, harness: Harness, gate: asyncio.Event
) -> None:
    thread_id = await thread(client, tenant, await defined(client, tenant, chat("slow")))
    harness.scripted.enqueue(turn(("slow", {})), turn())
    first = await said(client, tenant, thread_id, "Take your time")
    await harness.value_when_set("SELECT 1 FROM workflow_runs WHERE id = $1 AND status = 'RUNNING'", first)
    busy = await say(client, tenant, thread_id, "Are you done?")
    assert busy.status_code == 409
    assert busy.json()["error"]["code"] == "THREAD_BUSY"
    assert busy.json()["error"]["details"]["activeRunId"] == first
    gate.set()
    assert (await wait_for(client, tenant, first, "COMPLETED", "FAILED"))["status"] == "COMPLETED"
    assert (await client.get(f"/v1/threads/{thread_id}", headers=tenant.headers)).json()["data"][
        "activeRunId"
    ] is None


async def test_enqueued_messages_run_after_the_active_turn_in_order(
    client: httpx.AsyncClient, tenant: Tenant, harness: Harness, gate: asyncio.Event
) -> None:
    thread_id = await thread(client, tenant, await defined(client, tenant, chat("slow")), onActive="enqueue")
    harness.scripted.enqueue(turn(("slow", {})), turn(), turn(), turn())
    first = await said(client, tenant, thread_id, "one")
    await harness.value_when_set("SELECT 1 FROM workflow_runs WHERE id = $1 AND status = 'RUNNING'", first)
    queued = []
    for text in ("two", "three"):
        response = await say(client, tenant, thread_id, text)
        assert response.status_code == 202, response.text
        queued.append(response.json()["data"]["runId"])
    got = (await client.get(f"/v1/threads/{thread_id}", headers=tenant.headers)).json()["data"]
    assert got["activeRunId"] == first and got["queuedRunIds"] == queued
    await asyncio.sleep(0.3)
    statuses = [(await wait_for(client, tenant, r, "PENDING"))["status"] for r in queued]
    assert statuses == ["PENDING", "PENDING"]  # held behind the active turn
    # ... by the claim's fence, not a concurrency slot: no key, never queued for one, and the
    # recovery sweep leaves them alone (it would dispatch a turn that may start).
    slots = await harness.rt.pool.fetch(
        "SELECT concurrency_key, queued_at FROM workflow_runs WHERE id = ANY($1::text[])", [first, *queued]
    )
    assert {(r["concurrency_key"], r["queued_at"]) for r in slots} == {(None, None)}
    assert not set(await runs_db.mark_due_dispatched(harness.rt.pool, 0, 100)) & set(queued)
    gate.set()
    runs = [await wait_for(client, tenant, r, "COMPLETED", "FAILED") for r in (first, *queued)]
    assert [r["status"] for r in runs] == ["COMPLETED"] * 3
    assert runs[0]["completedAt"] <= runs[1]["startedAt"] and runs[1]["completedAt"] <= runs[2]["startedAt"]
    listed = (await client.get(f"/v1/threads/{thread_id}/messages", headers=tenant.headers)).json()["data"]
    assert [m["content"] for m in listed if m["role"] == "user"] == ["one", "two", "three"]


async def test_interrupt_cancels_the_active_turn_and_keeps_its_committed_tool_results(
    client: httpx.AsyncClient, tenant: Tenant, harness: Harness, gate: asyncio.Event
) -> None:
    thread_id = await thread(client, tenant, await defined(client, tenant, chat("lookup", "slow")))
    harness.scripted.enqueue(turn(("lookup", {"order": "o-7"})), turn(("slow", {})), turn())
    first = await said(client, tenant, thread_id, "Check o-7 slowly")
    await harness.value_when_set(
        "SELECT 1 FROM tool_trace WHERE workflow_run_id = $1 AND tool_name = 'lookup'", first
    )
    await harness.value_when_set("SELECT 1 FROM llm_calls WHERE workflow_run_id = $1 AND round = 2", first)
    before = len(harness.scripted.requests)
    response = await say(client, tenant, thread_id, "Stop, just tell me", onActive="interrupt")
    assert response.status_code == 201, response.text
    data = response.json()["data"]
    assert data["interruptedRunId"] == first and data["policy"] == "interrupt"
    cancelled = await wait_for(client, tenant, first, "CANCELLED")
    assert cancelled["error"]["reason"] == "interrupted"
    second = await wait_for(client, tenant, data["runId"], "COMPLETED", "FAILED")
    assert second["status"] == "COMPLETED"
    gate.set()  # the slow tool's late result must not be recorded
    await asyncio.sleep(0.3)
    traces = await harness.rt.pool.fetch(
        "SELECT tool_name FROM tool_trace WHERE workflow_run_id = $1 ORDER BY created_at", first
    )
    assert [t["tool_name"] for t in traces] == ["lookup"]
    (request,) = list(harness.scripted.requests)[before:]
    results = [m for m in request.messages if m.role == "tool"]
    assert '"o-7"' in (results[0].content or "")  # the committed lookup result
    assert len(results) == 2 and results[1].is_error  # the slow call never answered
    assert request.messages[-1].content == "Stop, just tell me"


async def test_steer_puts_the_message_in_the_active_runs_next_request_once(
    client: httpx.AsyncClient, tenant: Tenant, harness: Harness, gate: asyncio.Event
) -> None:
    thread_id = await thread(client, tenant, await defined(client, tenant, chat("slow")), onActive="steer")
    harness.scripted.enqueue(turn(("slow", {})), turn(), turn())
    first = await said(client, tenant, thread_id, "Start")
    await harness.value_when_set("SELECT 1 FROM llm_calls WHERE workflow_run_id = $1", first)
    response = await say(client, tenant, thread_id, "Also check o-9")
    assert response.status_code == 202, response.text
    assert response.json()["data"]["runId"] == first
    gate.set()
    assert (await wait_for(client, tenant, first, "COMPLETED", "FAILED"))["status"] == "COMPLETED"
    requests = [r for r in harness.scripted.requests if any(m.content == "Start" for m in r.messages)]
    second_round = requests[-1]
    assert [m.role for m in second_round.messages][-2:] == ["tool", "user"]
    assert second_round.messages[-1].content == "Also check o-9"
    assert sum(m.content == "Also check o-9" for m in second_round.messages) == 1
    events = await harness.events(first)
    injected = [e for e in events if e["event_type"] == "MESSAGE_INJECTED"]
    assert len(injected) == 1 and injected[0]["payload"]["round"] == 2
    stored = await harness.rt.pool.fetchval(
        "SELECT request FROM llm_calls WHERE workflow_run_id = $1 AND round = 2", first
    )
    assert stored["messages"] == [{"role": "user", "content": "Also check o-9"}]
    assert "feedback" not in stored  # a steered message is not guardrail feedback
    listed = (await client.get(f"/v1/threads/{thread_id}/messages", headers=tenant.headers)).json()["data"]
    steered = [m for m in listed if m["content"] == "Also check o-9"]
    assert steered == [{**steered[0], "injectedRound": 2, "status": "injected", "runId": first}]


async def test_steering_a_plain_run_and_an_ended_one(
    client: httpx.AsyncClient, tenant: Tenant, other_tenant: Tenant, harness: Harness, gate: asyncio.Event
) -> None:
    definition_id = await defined(client, tenant, chat("slow"))
    harness.scripted.enqueue(turn(("slow", {})), turn())
    created = await client.post(
        "/v1/workflow-runs",
        json={"definitionId": definition_id, "input": {"content": "go"}},
        headers=tenant.headers,
    )
    run_id = created.json()["data"]["id"]
    await harness.value_when_set("SELECT 1 FROM llm_calls WHERE workflow_run_id = $1", run_id)
    foreign = await client.post(
        f"/v1/workflow-runs/{run_id}/messages", json={"content": "x"}, headers=other_tenant.headers
    )
    assert foreign.status_code == 404
    sent = await client.post(
        f"/v1/workflow-runs/{run_id}/messages", json={"content": "faster"}, headers=tenant.headers
    )
    assert sent.status_code == 202, sent.text
    gate.set()
    assert (await wait_for(client, tenant, run_id, "COMPLETED"))["status"] == "COMPLETED"
    assert harness.scripted.requests[-1].messages[-1].content == "faster"
    late = await client.post(
        f"/v1/workflow-runs/{run_id}/messages", json={"content": "x"}, headers=tenant.headers
    )
    assert late.status_code == 409


async def test_deleting_a_thread_cancels_its_active_turn(
    client: httpx.AsyncClient, tenant: Tenant, harness: Harness, gate: asyncio.Event
) -> None:
    thread_id = await thread(client, tenant, await defined(client, tenant, chat("slow")))
    harness.scripted.enqueue(turn(("slow", {})), turn())
    first = await said(client, tenant, thread_id, "Start")
    await harness.value_when_set("SELECT 1 FROM workflow_runs WHERE id = $1 AND status = 'RUNNING'", first)
    deleted = await client.delete(f"/v1/threads/{thread_id}", headers=tenant.headers)
    assert deleted.status_code == 200, deleted.text
    assert (await wait_for(client, tenant, first, "CANCELLED"))["status"] == "CANCELLED"
    assert (await client.get(f"/v1/threads/{thread_id}", headers=tenant.headers)).status_code == 404
    gate.set()


async def test_a_fork_continues_the_conversation_and_goes_its_own_way(
    client: httpx.AsyncClient, tenant: Tenant, harness: Harness
) -> None:
    origin = await thread(client, tenant, await defined(client, tenant, chat()), state={"k": "v"})
    harness.scripted.enqueue(turn(), turn(), turn())
    first = await said(client, tenant, origin, "Plan a trip")
    await wait_for(client, tenant, first, "COMPLETED")
    forked = await client.post("/v1/threads", json={"forkOf": origin}, headers=tenant.headers)
    assert forked.status_code == 201, forked.text
    fork = forked.json()["data"]
    assert fork["forkedFromRunId"] == first and fork["state"] == {"k": "v", "agent": "done"}
    before = len(harness.scripted.requests)
    mine = await said(client, tenant, fork["id"], "Make it cheaper")
    await wait_for(client, tenant, mine, "COMPLETED")
    theirs = await said(client, tenant, origin, "Make it longer")
    await wait_for(client, tenant, theirs, "COMPLETED")
    fork_request, origin_request = list(harness.scripted.requests)[before:]
    assert [m.content for m in fork_request.messages][1:] == ["Plan a trip", "done", "Make it cheaper"]
    assert [m.content for m in origin_request.messages][1:] == ["Plan a trip", "done", "Make it longer"]
    listed = (await client.get(f"/v1/threads/{fork['id']}/messages", headers=tenant.headers)).json()["data"]
    assert [(m["content"], m["runId"], m["status"]) for m in listed] == [
        ("Plan a trip", first, "forked"),
        ("done", first, "forked"),
        ("Make it cheaper", mine, None),
        ("done", mine, None),
    ]


async def test_a_run_nobody_steers_never_looks_for_messages_and_a_queued_turn_gets_its_message_first(
    client: httpx.AsyncClient,
    tenant: Tenant,
    harness: Harness,
    gate: asyncio.Event,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The step queries `run_messages` only when a checkpoint (or the statement that started the
    execution) said some wait: none for a run nobody steers; a message sent to a turn still
    queued is in that turn's first request."""
    looked: list[str] = []
    original = db_threads.messages_to_inject

    async def counted(pool: Any, run_id: str, *args: Any) -> Any:
        looked.append(run_id)
        return await original(pool, run_id, *args)

    monkeypatch.setattr(db_threads, "messages_to_inject", counted)
    thread_id = await thread(client, tenant, await defined(client, tenant, chat("lookup", "slow")))
    harness.scripted.enqueue(turn(("lookup", {"order": "o-1"})), turn(("lookup", {"order": "o-2"})), turn())
    plain = await said(client, tenant, thread_id, "Three rounds, nobody steers")
    assert (await wait_for(client, tenant, plain, "COMPLETED", "FAILED"))["status"] == "COMPLETED"
    assert looked == []  # three model calls, no query for messages

    harness.scripted.enqueue(turn(("slow", {})), turn(), turn())
    active = await said(client, tenant, thread_id, "Slow one")
    await harness.value_when_set("SELECT 1 FROM llm_calls WHERE workflow_run_id = $1", active)
    queued = await say(client, tenant, thread_id, "Next turn", onActive="enqueue")
    assert queued.status_code == 202, queued.text
    queued_run = queued.json()["data"]["runId"]
    sent = await client.post(
        f"/v1/workflow-runs/{queued_run}/messages", json={"content": "and be brief"}, headers=tenant.headers
    )
    assert sent.status_code == 202, sent.text
    gate.set()
    assert (await wait_for(client, tenant, queued_run, "COMPLETED", "FAILED"))["status"] == "COMPLETED"
    assert active not in looked  # its round boundary saw no message waiting for it
    assert looked == [queued_run]  # once, before its first call: the claim said one waited
    first_request = harness.scripted.requests[-1]
    assert [m.content for m in first_request.messages][-2:] == ["Next turn", "and be brief"]
    events = await harness.events(queued_run)
    assert [e["payload"]["round"] for e in events if e["event_type"] == "MESSAGE_INJECTED"] == [1]


async def test_a_turn_stores_what_it_added_and_a_reference_not_the_history_again(
    client: httpx.AsyncClient, tenant: Tenant, harness: Harness, gate: asyncio.Event
) -> None:
    """Each turn's first call stores the earlier turn's run id (`historyFrom`) in place of the
    history; requests rebuilt through that chain stay byte for byte what was sent, for later
    turns, the message listing and a fork of the thread."""
    thread_id = await thread(client, tenant, await defined(client, tenant, chat("lookup")))
    harness.scripted.enqueue(turn(), turn(("lookup", {"order": "o-2"})), turn(), turn(), turn())
    before = len(harness.scripted.requests)
    turns = []
    for content in ["Where is o-1?", "And o-2?", "Thanks, and o-3?"]:
        turns.append(await said(client, tenant, thread_id, content))
        assert (await wait_for(client, tenant, turns[-1], "COMPLETED", "FAILED"))["status"] == "COMPLETED"
    requests = list(harness.scripted.requests)[before:]
    assert len(requests) == 4  # an answer, then a tool round and an answer, then an answer
    for last, first in [(requests[0], requests[1]), (requests[2], requests[3])]:
        assert wire(first)[: len(wire(last))] == wire(last)
        assert len(first.messages) == len(last.messages) + 2
    # A resumed second turn rebuilds what it sent, its history through the reference included.
    rounds = await checkpoints.load_rounds(harness.rt.pool, turns[1], "agent", 1)
    rebuilt = rebuild(rounds, [], await histories_for(harness.rt.pool, rounds, "agent")).transcript
    assert [json.dumps(m.to_dict(), ensure_ascii=False) for m in rebuilt][: len(wire(requests[2]))] == wire(
        requests[2]
    )
    stored = {
        r["workflow_run_id"]: r["request"]
        for r in await harness.rt.pool.fetch(
            "SELECT workflow_run_id, request FROM llm_calls WHERE workflow_run_id = ANY($1::text[]) AND round = 1",
            turns,
        )
    }
    assert "historyFrom" not in stored[turns[0]]
    for previous, mine, content in [
        (turns[0], turns[1], "And o-2?"),
        (turns[1], turns[2], "Thanks, and o-3?"),
    ]:
        assert stored[mine]["historyFrom"] == previous and stored[mine]["historyAt"] == 1
        assert [m["content"] for m in stored[mine]["messages"]] == ["You help with orders.", content]
    listed = (await client.get(f"/v1/threads/{thread_id}/messages", headers=tenant.headers)).json()["data"]
    assert [(m["role"], m["runId"]) for m in listed] == [
        ("user", turns[0]),
        ("assistant", turns[0]),
        ("user", turns[1]),
        ("assistant", turns[1]),
        ("tool", turns[1]),
        ("assistant", turns[1]),
        ("user", turns[2]),
        ("assistant", turns[2]),
    ]
    forked = await client.post("/v1/threads", json={"forkOf": thread_id}, headers=tenant.headers)
    assert forked.status_code == 201, forked.text
    mine = await said(client, tenant, forked.json()["data"]["id"], "And o-4?")
    assert (await wait_for(client, tenant, mine, "COMPLETED", "FAILED"))["status"] == "COMPLETED"
    fork_request = harness.scripted.requests[-1]
    assert wire(fork_request)[: len(wire(requests[3]))] == wire(requests[3])
    assert fork_request.messages[-1].content == "And o-4?"
