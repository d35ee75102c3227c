"""`stevora chat` (issue 33): lines are turns of a thread, the answer of each printed; /fork
continues in a new thread; --thread picks a thread up with its history."""

from __future__ import annotations

from typing import Any

import stevora.cli.chat  # noqa: F401  (registers `stevora chat` on the app)
from tests.conftest import create_definition
from tests.integration.cli.conftest import Cli


async def test_chat_turns_fork_and_history(cli: Cli, harness: Any, workspace_id: str) -> None:
    await create_definition(
        harness.rt,
        workspace_id,
        {
            "name": "helper",
            "version": "1",
            "steps": [
                {
                    "type": "llm",
                    "name": "agent",
                    "model": "scripted",
                    "messages": [{"role": "user", "content": "{{input.content}}"}],
                }
            ],
        },
    )
    result = await cli("chat", "helper", input="Hello there\n/fork\nSecond question\n/history\n/quit\n")
    assert result.exit_code == 0, result.output
    threads = await harness.rt.pool.fetch(
        "SELECT id, forked_from_run_id FROM threads WHERE workspace_id = $1 ORDER BY created_at", workspace_id
    )
    assert len(threads) == 2 and threads[1]["forked_from_run_id"] is not None
    turns = await harness.rt.pool.fetch(
        "SELECT thread_id, status, input FROM workflow_runs WHERE workspace_id = $1 AND thread_id IS NOT NULL "
        "ORDER BY created_at",
        workspace_id,
    )
    assert [(t["thread_id"], t["status"], t["input"]["content"]) for t in turns] == [
        (threads[0]["id"], "COMPLETED", "Hello there"),
        (threads[1]["id"], "COMPLETED", "Second question"),
    ]
    out = result.stdout
    # Each answer printed after its turn, then /history shows both exchanges (the fork's history).
    assert out.count("> Hello there") == 1 and out.count("> Second question") == 1
    again = await cli("chat", "helper", "--thread", threads[1]["id"], input="/quit\n")
    assert again.exit_code == 0 and "> Hello there" in again.stdout and "> Second question" in again.stdout
