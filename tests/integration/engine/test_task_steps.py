"""Task steps: `timeoutMs`, `__nextStep` targets, tracebacks on the step error, and the retry
backoff actually being waited."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import structlog

from stevora.definitions import TaskStep
from stevora.engine import commands
from stevora.engine.steps.task import DEFAULT_TASK_TIMEOUT_MS
from stevora.ids import new_id
from stevora.tasks import MAX_STACK_CHARS
from tests.conftest import Harness, create_definition


def workflow(*steps: dict[str, Any]) -> dict[str, Any]:
    return {"name": new_id("tasks"), "version": "1", "steps": list(steps)}


async def run_to_end(harness: Harness, workspace_id: str, spec: dict[str, Any], timeout_s: float = 10) -> Any:
    def_id = await create_definition(harness.rt, workspace_id, spec)
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id)
    return await harness.wait_for_status(run["id"], "COMPLETED", "FAILED", timeout_s=timeout_s)


def test_task_timeout_defaults_to_five_minutes_without_changing_stored_definitions() -> None:
    step = TaskStep.model_validate({"type": "task", "name": "t", "handler": "h"})
    assert step.timeout_ms is None and DEFAULT_TASK_TIMEOUT_MS == 300_000
    assert "timeoutMs" not in step.model_dump(by_alias=True, exclude_none=True)
    assert (
        TaskStep.model_validate({"type": "task", "name": "t", "handler": "h", "timeoutMs": 50}).timeout_ms
        == 50
    )


async def test_a_hung_task_times_out_under_the_retry_policy(harness: Harness, workspace_id: str) -> None:
    attempts: list[int] = []
    cancelled: list[int] = []

    async def hang(ctx: Any) -> None:
        attempts.append(ctx.attempt)
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(ctx.attempt)
            raise

    harness.tasks.register("hang", hang)
    spec = workflow(
        {
            "type": "task",
            "name": "t",
            "handler": "hang",
            "timeoutMs": 200,
            "retry": {"maxAttempts": 2, "backoffMs": 100},
        }
    )
    started = asyncio.get_running_loop().time()
    row = await run_to_end(harness, workspace_id, spec)
    elapsed = asyncio.get_running_loop().time() - started

    assert row["status"] == "FAILED"
    assert row["error"]["code"] == "TIMEOUT" and "200 ms" in row["error"]["message"]
    assert row["error"]["attempts"] == 2
    assert attempts == [1, 2] and cancelled == [1, 2]
    assert elapsed < 3
    types = await harness.event_types(row["id"])
    assert types.count("STEP_RETRYING") == 1


async def test_unknown_next_step_fails_the_step_naming_the_target(
    harness: Harness, workspace_id: str
) -> None:
    calls: list[int] = []

    async def jump(ctx: Any) -> dict[str, Any]:
        calls.append(ctx.attempt)
        return {"status": "completed", "__nextStep": "nowhere"}

    harness.tasks.register("jump", jump)
    spec = workflow(
        {"type": "task", "name": "a", "handler": "jump", "retry": {"maxAttempts": 3, "backoffMs": 100}},
        {"type": "task", "name": "b", "handler": "jump"},
    )
    row = await run_to_end(harness, workspace_id, spec)

    assert row["status"] == "FAILED"
    assert row["error"]["code"] == "UNKNOWN_NEXT_STEP"
    assert "'nowhere'" in row["error"]["message"] and row["error"]["stepName"] == "a"
    assert calls == [1]  # not retryable
    assert "STEP_RETRYING" not in await harness.event_types(row["id"])


async def test_next_step_in_a_plain_output_is_checked_too(harness: Harness, workspace_id: str) -> None:
    harness.tasks.register("plain", lambda ctx: {"__nextStep": "missing", "x": 1})
    row = await run_to_end(harness, workspace_id, workflow({"type": "task", "name": "a", "handler": "plain"}))
    assert row["status"] == "FAILED" and row["error"]["code"] == "UNKNOWN_NEXT_STEP"


async def test_a_known_next_step_jumps_and_skips_the_steps_between(
    harness: Harness, workspace_id: str
) -> None:
    ran: list[str] = []

    async def record(ctx: Any) -> dict[str, Any] | None:
        ran.append(ctx.step_name)
        return {"status": "completed", "__nextStep": "c"} if ctx.step_name == "a" else None

    harness.tasks.register("record", record)
    spec = workflow(*({"type": "task", "name": n, "handler": "record"} for n in "abc"))
    row = await run_to_end(harness, workspace_id, spec)
    assert row["status"] == "COMPLETED", row["error"]
    assert ran == ["a", "c"]
    assert "STEP_SKIPPED" in await harness.event_types(row["id"])


def _explode(depth: int) -> None:
    if depth == 0:
        raise ValueError("bad input")
    _explode(depth - 1)


async def test_a_failing_handler_keeps_its_traceback_in_the_log_and_on_the_step_error(
    harness: Harness, workspace_id: str
) -> None:
    def shallow(ctx: Any) -> None:
        _explode(2)

    def deep(ctx: Any) -> None:
        raise ValueError("bad input " + "x" * (2 * MAX_STACK_CHARS))

    harness.tasks.register("shallow", shallow)
    harness.tasks.register("deep", deep)
    with structlog.testing.capture_logs() as logs:
        row = await run_to_end(
            harness,
            workspace_id,
            workflow({"type": "task", "name": "a", "handler": "shallow", "retry": {"maxAttempts": 1}}),
        )
    assert row["status"] == "FAILED"
    error = row["error"]
    assert error["message"] == "ValueError: bad input"
    assert error["stack"].startswith("Traceback (most recent call last)")
    assert "in _explode" in error["stack"] and "ValueError: bad input" in error["stack"]
    raised = [e for e in logs if e["event"] == "task_handler_raised"]
    assert raised and isinstance(raised[0]["exc_info"], ValueError)

    row = await run_to_end(
        harness,
        workspace_id,
        workflow({"type": "task", "name": "a", "handler": "deep", "retry": {"maxAttempts": 1}}),
    )
    stack = row["error"]["stack"]
    assert len(stack) <= MAX_STACK_CHARS + 100 and stack.startswith("... (truncated)")
    assert stack.rstrip().endswith("x" * 100)  # the end of a traceback is what matters


async def test_retries_wait_out_the_exponential_backoff(harness: Harness, workspace_id: str) -> None:
    """Removing the backoff (retrying at once) must fail this test."""
    failed_at: list[float] = []

    def flaky(ctx: Any) -> None:
        failed_at.append(time.monotonic())  # runs in a worker thread
        raise RuntimeError("boom")

    harness.tasks.register("flaky", flaky)
    spec = workflow(
        {
            "type": "task",
            "name": "t",
            "handler": "flaky",
            "retry": {"maxAttempts": 3, "backoffMs": 300, "backoffMultiplier": 2},
        }
    )
    row = await run_to_end(harness, workspace_id, spec)

    assert row["status"] == "FAILED" and len(failed_at) == 3
    retrying = [e["payload"] for e in await harness.events(row["id"]) if e["event_type"] == "STEP_RETRYING"]
    assert [r["nextAttempt"] for r in retrying] == [2, 3]
    assert 240 <= retrying[0]["delayMs"] <= 360 and 480 <= retrying[1]["delayMs"] <= 720
    # Each retry starts (STEP_STARTED, in the next attempt's transaction) no sooner than its delay
    # after the STEP_RETRYING that scheduled it.
    events = await harness.events(row["id"])
    scheduled = [e["created_at"] for e in events if e["event_type"] == "STEP_RETRYING"]
    started = [e["created_at"] for e in events if e["event_type"] == "STEP_STARTED"][1:]
    for when, began, payload in zip(scheduled, started, retrying, strict=True):
        waited_ms = (began - when).total_seconds() * 1000
        assert payload["delayMs"] - 5 <= waited_ms < payload["delayMs"] + 1000, (waited_ms, payload)
