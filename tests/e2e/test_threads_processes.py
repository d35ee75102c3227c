"""Threads with real worker processes on both brokers (issue 33, "Done when"): the second turn's
request carries the first exchange; each onActive policy against a turn still in a slow tool;
a steered message survives a SIGKILL of the worker between acceptance and injection (and
between injection and the round's model call) and goes in once."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from stevora.engine import commands, threads
from stevora.engine.steps.llm_thread import conversation_of
from stevora.ids import new_id
from tests.conftest import create_definition
from tests.e2e.conftest import BrokerSetup
from tests.e2e.test_crash_recovery import assert_gap_free, wait_status
from tests.e2e.workerproc import WorkerProcess

pytestmark = pytest.mark.broker


def agent(*tools: str, rounds: int = 1) -> dict[str, Any]:
    return {
        "name": new_id("chat"),
        "version": "1",
        "steps": [
            {
                "type": "llm",
                "name": "agent",
                "model": f"scripted:rounds={rounds}",
                "maxToolRounds": 5,
                "systemPrompt": "You are a patient assistant.",
                "messages": [{"role": "user", "content": "{{input.content}}"}],
                "tools": list(tools),
            }
        ],
    }


async def new_thread(setup: BrokerSetup, *tools: str, rounds: int = 1, on_active: str = "reject") -> str:
    definition_id = await create_definition(setup.rt, setup.workspace_id, agent(*tools, rounds=rounds))
    row = await threads.create_thread(
        setup.rt, setup.workspace_id, definition_id, metadata={}, state={}, on_active=on_active
    )
    return row.id


async def requests(setup: BrokerSetup, run_id: str) -> list[list[dict[str, Any]]]:
    """Each committed model call's newly sent messages, by round; a turn's first call with the
    history it continued, which it stores as a reference to the earlier turn (`historyFrom`)."""
    rows = await setup.rt.pool.fetch(
        "SELECT request FROM llm_calls WHERE workflow_run_id = $1 AND status = 'completed' ORDER BY round",
        run_id,
    )
    sent = []
    for r in rows:
        messages, ref = list(r["request"]["messages"]), r["request"].get("historyFrom")
        if ref is not None:
            at = r["request"]["historyAt"]
            messages[at:at] = [m.to_dict() for m in await conversation_of(setup.rt.pool, ref, "agent")]
        sent.append(messages)
    return sent


async def in_tool(setup: BrokerSetup, run_id: str, round_: int = 1) -> None:
    """Wait until the run's model asked for its round's tools (the slow one is running)."""
    for _ in range(300):
        if await setup.rt.pool.fetchval(
            "SELECT 1 FROM llm_calls WHERE workflow_run_id = $1 AND round = $2", run_id, round_
        ):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"run {run_id} never reached round {round_}")


@pytest.fixture
async def worker(broker_setup: BrokerSetup) -> Any:
    w = WorkerProcess(broker_setup.rt.settings.database_url, broker_setup.url, broker_setup.queue)
    yield w
    w.stop()


async def test_two_turns_then_reject_and_enqueue_against_a_slow_turn(
    broker_setup: BrokerSetup, worker: WorkerProcess
) -> None:
    setup = broker_setup
    thread_id = await new_thread(setup, "effect", "remember")
    first = await threads.send(setup.rt, setup.workspace_id, thread_id, "Note the order")
    await wait_status(setup, first.run_id, "COMPLETED", workers=(worker,))
    second = await threads.send(setup.rt, setup.workspace_id, thread_id, "Anything else?", "enqueue")
    assert not second.queued  # nothing active: it starts at once
    await wait_status(setup, second.run_id, "COMPLETED", workers=(worker,))
    (sent,) = await requests(setup, second.run_id)  # the scripted agent answers from the history
    first_calls = await requests(setup, first.run_id)
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool", "tool", "assistant", "user"]
    assert sent[1] == first_calls[0][1]  # the first turn's message as it sent it (system left out)
    assert sent[2]["tool_calls"] and sent[5]["content"] and len(first_calls) == 2
    assert sent[1]["content"] == "Note the order" and sent[-1]["content"] == "Anything else?"
    assert [c["name"] for c in sent[2]["tool_calls"]] == ["effect", "remember"]
    # The state carried over: the first turn's tool wrote it, the second started from it.
    second_row = await setup.rt.pool.fetchrow("SELECT state FROM workflow_runs WHERE id = $1", second.run_id)
    assert len(second_row["state"]["remembered"]) == 1
    # A turn that naps: a message meanwhile is refused, an enqueued one waits its turn.
    thread_id = await new_thread(setup, "nap")
    third = await threads.send(setup.rt, setup.workspace_id, thread_id, "Nap on it")
    await in_tool(setup, third.run_id)
    with pytest.raises(threads.ThreadBusy) as busy:
        await threads.send(setup.rt, setup.workspace_id, thread_id, "Done yet?", "reject")
    assert busy.value.details["activeRunId"] == third.run_id
    queued = await threads.send(setup.rt, setup.workspace_id, thread_id, "After that", "enqueue")
    assert queued.queued
    done = await wait_status(setup, third.run_id, "COMPLETED", workers=(worker,))
    after = await wait_status(setup, queued.run_id, "COMPLETED", workers=(worker,))
    assert after["started_at"] >= done["completed_at"]
    assert (await requests(setup, queued.run_id))[0][-1]["content"] == "After that"


async def test_interrupt_keeps_the_committed_tool_results_in_the_next_turn(
    broker_setup: BrokerSetup, worker: WorkerProcess
) -> None:
    setup = broker_setup
    thread_id = await new_thread(setup, "effect", "nap")
    first = await threads.send(setup.rt, setup.workspace_id, thread_id, "Note, then nap")
    await setup_wait_trace(setup, first.run_id, "effect")
    second = await threads.send(setup.rt, setup.workspace_id, thread_id, "Stop", "interrupt")
    assert second.interrupted_run_id == first.run_id and not second.queued
    ended = await wait_status(setup, first.run_id, "CANCELLED", workers=(worker,))
    assert ended["error"]["reason"] == "interrupted"
    await wait_status(setup, second.run_id, "COMPLETED", workers=(worker,))
    await asyncio.sleep(3.5)  # the nap would have ended: its late result must not be recorded
    traces = await setup.rt.pool.fetch(
        "SELECT tool_name, result_text FROM tool_trace WHERE workflow_run_id = $1", first.run_id
    )
    assert [t["tool_name"] for t in traces] == ["effect"]
    (sent, *_) = await requests(setup, second.run_id)
    tool_results = [m for m in sent if m["role"] == "tool"]
    assert len(tool_results) == 1 and tool_results[0]["name"] == "effect"  # the committed one
    assert sent[-1]["content"] == "Stop"
    await assert_gap_free(setup, first.run_id)


async def setup_wait_trace(setup: BrokerSetup, run_id: str, tool_name: str) -> None:
    for _ in range(300):
        if await setup.rt.pool.fetchval(
            "SELECT 1 FROM tool_trace WHERE workflow_run_id = $1 AND tool_name = $2", run_id, tool_name
        ):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{tool_name} never committed in {run_id}")


async def test_steer_goes_into_the_active_runs_next_request_once(
    broker_setup: BrokerSetup, worker: WorkerProcess
) -> None:
    setup = broker_setup
    thread_id = await new_thread(setup, "nap", on_active="steer")
    first = await threads.send(setup.rt, setup.workspace_id, thread_id, "Nap first")
    await in_tool(setup, first.run_id)
    steered = await threads.send(setup.rt, setup.workspace_id, thread_id, "Then say hello")
    assert steered.queued and steered.run_id == first.run_id
    await wait_status(setup, first.run_id, "COMPLETED", workers=(worker,))
    rounds = await requests(setup, first.run_id)
    assert [(m["role"], m["content"]) for m in rounds[1]][-1] == ("user", "Then say hello")
    assert sum(m.get("content") == "Then say hello" for r in rounds for m in r) == 1
    types = await assert_gap_free(setup, first.run_id)
    assert types.count("MESSAGE_INJECTED") == 1


@pytest.mark.parametrize("broker_setup", ["rabbitmq"], indirect=True)  # crash points are broker-independent
# tool_committed:1:0 — killed after acceptance, before the boundary took the message (still pending);
# llm_call_starting:2 — killed after MESSAGE_INJECTED committed, before the round's model call did.
@pytest.mark.parametrize("fault", ["tool_committed:1:0", "llm_call_starting:2"])
async def test_a_steered_message_survives_the_worker_killed_and_goes_in_once(
    broker_setup: BrokerSetup, fault: str
) -> None:
    setup = broker_setup
    thread_id = await new_thread(setup, "nap", on_active="steer")
    first_worker = WorkerProcess(setup.rt.settings.database_url, setup.url, setup.queue, fault=fault)
    second_worker = None
    try:
        sent = await threads.send(setup.rt, setup.workspace_id, thread_id, "Nap first")
        await in_tool(setup, sent.run_id)
        await threads.send(setup.rt, setup.workspace_id, thread_id, "Then say hello")
        assert await first_worker.wait_exit(40) == -9, first_worker.log_tail()
        second_worker = WorkerProcess(setup.rt.settings.database_url, setup.url, setup.queue)
        await wait_status(setup, sent.run_id, "COMPLETED", workers=(first_worker, second_worker))
    finally:
        first_worker.stop()
        if second_worker is not None:
            second_worker.stop()
    rounds = await requests(setup, sent.run_id)
    assert len(rounds) == 2 and rounds[1][-1] == {"role": "user", "content": "Then say hello"}
    assert sum(m.get("content") == "Then say hello" for r in rounds for m in r) == 1
    types = await assert_gap_free(setup, sent.run_id)
    assert types.count("MESSAGE_INJECTED") == 1
    status = await setup.rt.pool.fetchval(
        "SELECT status FROM run_messages WHERE workflow_run_id = $1", sent.run_id
    )
    assert status == "injected"


@pytest.mark.parametrize("broker_setup", ["rabbitmq"], indirect=True)
# tool_returned: the handler ran (and buffered its write) but its checkpoint did not commit: it runs
# again; tool_committed: its checkpoint committed: it is not run again.
@pytest.mark.parametrize("fault", ["tool_returned:1:0", "tool_committed:1:0"])
async def test_a_store_write_lands_once_when_the_worker_is_killed_around_its_checkpoint(
    broker_setup: BrokerSetup, fault: str
) -> None:
    setup = broker_setup
    definition_id = await create_definition(setup.rt, setup.workspace_id, agent("count_visit"))
    first_worker = WorkerProcess(setup.rt.settings.database_url, setup.url, setup.queue, fault=fault)
    second_worker = None
    try:
        run, _ = await commands.create_run(setup.rt, setup.workspace_id, definition_id, {"content": "count"})
        assert await first_worker.wait_exit(40) == -9, first_worker.log_tail()
        second_worker = WorkerProcess(setup.rt.settings.database_url, setup.url, setup.queue)
        await wait_status(setup, run["id"], "COMPLETED", workers=(first_worker, second_worker))
    finally:
        first_worker.stop()
        if second_worker is not None:
            second_worker.stop()
    pool = setup.rt.pool
    value = await pool.fetchval(
        "SELECT value FROM store_items WHERE workspace_id = $1 AND namespace = 'visits' AND key = $2",
        setup.workspace_id,
        run["id"],
    )
    assert value == {"n": 1}
    key = await pool.fetchval("SELECT idempotency_key FROM tool_trace WHERE workflow_run_id = $1", run["id"])
    executions = await pool.fetchval(
        "SELECT executions FROM test_side_effects WHERE idempotency_key = $1", key
    )
    assert executions == (2 if fault.startswith("tool_returned") else 1)  # the handler did run twice


async def test_a_later_thread_reads_what_a_tool_stored(
    broker_setup: BrokerSetup, worker: WorkerProcess
) -> None:
    setup = broker_setup
    first = await threads.send(
        setup.rt, setup.workspace_id, await new_thread(setup, "save_preference"), "I like tea"
    )
    await wait_status(setup, first.run_id, "COMPLETED", workers=(worker,))
    later = await threads.send(
        setup.rt, setup.workspace_id, await new_thread(setup, "read_preference"), "What do I like?"
    )
    await wait_status(setup, later.run_id, "COMPLETED", workers=(worker,))
    output = await setup.rt.pool.fetchval(
        "SELECT output_json::text FROM tool_trace WHERE workflow_run_id = $1", later.run_id
    )
    assert json.loads(output) == {"found": [{"drink": "green tea"}]}
