"""Budgets stop a runaway agent (issue 18, item 2): a fake model that asks for tools for ever,
through the real OpenAI SDK, is stopped at exactly the run's `maxToolCalls`, `maxModelCalls` or
`maxCostCents`, with BUDGET_EXCEEDED and no step retry; the counts come from committed rows, so a
step retry (or a resume) goes on from what was used; `onBudgetExceeded: "pause"` waits for a
person and a raise resumes the run."""

from __future__ import annotations

import itertools
from typing import Any

from stevora.definitions import Budget
from stevora.engine import commands
from stevora.engine.budget import Meter, update_budget
from stevora.llm.pricing import Pricing
from stevora.testing.fake_llm import FakeLLMServer, FakeResponse, error, openai_text, openai_tool_calls
from stevora.tools import ToolContext
from tests.conftest import Harness, create_definition
from tests.integration.loop.conftest import LoopRun, SdkProviders, llm_step, load_run, run_workflow
from tests.integration.loop.test_loop_basics import assert_trace_event_consistency


def _runaway(fake: FakeLLMServer, *names: str) -> None:
    """The model asks for `names` (one call each) in every round, for ever."""
    ids = itertools.count(1)

    def respond(body: dict[str, Any]) -> FakeResponse:
        n = next(ids)
        return openai_tool_calls([(f"call_{n}_{i}", name, "{}") for i, name in enumerate(names)])

    fake.openai.responder = respond


def _lookup(harness: Harness) -> list[int]:
    ran: list[int] = []

    @harness.tools.tool
    async def lookup() -> str:
        """Look something up."""
        ran.append(1)
        return "more to look up"

    return ran


# Retries on: a budget stop must not be retried anyway.
RUNAWAY = llm_step(tools=["lookup"], maxToolRounds=20, retry={"maxAttempts": 3, "backoffMs": 100})


def _workflow(budget: dict[str, Any], step: dict[str, Any] = RUNAWAY) -> dict[str, Any]:
    return {"name": "runaway", "version": "1", "budget": budget, "steps": [step]}


async def _run(harness: Harness, workspace_id: str, spec: dict[str, Any], **create: Any) -> LoopRun:
    def_id = await create_definition(harness.rt, workspace_id, spec)
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id, {"question": "go"}, **create)
    row = await harness.wait_for_status(run["id"], "COMPLETED", "FAILED", timeout_s=30)
    return await load_run(harness, row["id"])


def _assert_budget_failure(result: LoopRun, limit: str) -> dict[str, Any]:
    assert result.status == "FAILED", result.run["error"]
    error = result.run["error"]
    assert error["code"] == "BUDGET_EXCEEDED" and error["details"]["limit"] == limit, error
    assert error["retryable"] is False
    # Not retried although the step's RetryPolicy allows 3 attempts.
    assert "STEP_RETRYING" not in result.event_types()
    assert [s["attempt"] for s in result.step_runs] == [1]
    return dict(error["details"])


async def test_max_tool_calls_stops_a_runaway_agent_at_exactly_the_limit(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    ran = _lookup(harness)
    _runaway(fake, "lookup")
    result = await _run(harness, workspace_id, _workflow({"maxToolCalls": 5}))

    details = _assert_budget_failure(result, "maxToolCalls")
    assert len(ran) == 5 and len(result.traces) == 5
    # The sixth round's call was asked for and refused: six model calls, five tool calls.
    assert len(result.llm_calls) == 6
    assert details["max"] == 5 and details["used"]["toolCalls"] == 5
    assert result.run["error"]["message"] == "The run reached its budget: maxToolCalls 5 (used 5)"
    await assert_trace_event_consistency(harness, result.id)


async def test_max_model_calls_stops_a_runaway_agent_at_exactly_the_limit(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    ran = _lookup(harness)
    _runaway(fake, "lookup")
    result = await _run(harness, workspace_id, _workflow({"maxModelCalls": 4}))

    details = _assert_budget_failure(result, "maxModelCalls")
    assert len(fake.openai.requests) == 4 and len(result.llm_calls) == 4
    assert len(ran) == 4  # each answered round's tool ran; the fifth model call was never sent
    assert details["used"]["modelCalls"] == 4


async def test_max_cost_cents_lets_the_call_that_crosses_the_line_finish_and_refuses_the_next(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    # 10 prompt tokens at 10,000 USD per million = 0.1 USD = 10 cents per call.
    harness.rt.pricing = Pricing({"gpt-4o-mini": (10_000.0, 0.0)})
    _lookup(harness)
    _runaway(fake, "lookup")
    result = await _run(harness, workspace_id, _workflow({"maxCostCents": 25}))

    details = _assert_budget_failure(result, "maxCostCents")
    # 0 → 10 → 20 → 30: the third call crossed 25 and finished; the fourth was refused unsent.
    assert len(fake.openai.requests) == 3
    assert round(result.run["total_cost_cents"], 6) == 30
    assert round(details["used"]["costCents"], 6) == 30


async def test_a_round_asking_for_more_calls_than_are_left_runs_them_in_order_up_to_the_limit(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    ran = _lookup(harness)
    _runaway(fake, "lookup", "lookup", "lookup")
    step = {**RUNAWAY, "parallelToolCalls": True}
    result = await _run(harness, workspace_id, _workflow({"maxToolCalls": 4}, step))

    _assert_budget_failure(result, "maxToolCalls")
    assert len(ran) == 4
    assert [(t["round"], t["sequence"]) for t in result.traces] == [(1, 0), (1, 1), (1, 2), (2, 0)]
    await assert_trace_event_consistency(harness, result.id)


async def test_calls_of_tools_the_step_does_not_offer_do_not_count_against_max_tool_calls(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    ran = _lookup(harness)
    _runaway(fake, "delete_everything", "lookup")
    result = await _run(harness, workspace_id, _workflow({"maxToolCalls": 2}))

    details = _assert_budget_failure(result, "maxToolCalls")
    assert len(ran) == 2 and details["used"]["toolCalls"] == 2
    refused = [t for t in result.traces if t["error_code"] == "TOOL_NOT_OFFERED"]
    assert len(refused) == 3  # rounds 1-3 each refused it; round 3's lookup hit the budget
    assert len(result.traces) == 5


async def test_the_run_create_budget_overrides_the_definition_default_field_by_field(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    ran = _lookup(harness)
    _runaway(fake, "lookup")
    result = await _run(
        harness,
        workspace_id,
        _workflow({"maxToolCalls": 10, "maxModelCalls": 3}),
        budget=Budget.model_validate({"maxToolCalls": 2}),
    )

    _assert_budget_failure(result, "maxToolCalls")
    assert len(ran) == 2
    assert result.run["budget"] == {"maxToolCalls": 2, "maxModelCalls": 3, "onBudgetExceeded": "fail"}


async def test_usage_survives_a_step_retry_the_retried_attempt_goes_on_from_what_was_used(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    """Attempt 1 makes two answered calls (and runs their tools) and one that fails with a 500;
    attempt 2 reads the usage back from the committed rows: with maxModelCalls 4 it may make one
    more call, not four."""
    ran = _lookup(harness)
    fake.openai.enqueue(
        openai_tool_calls([("call_a", "lookup", "{}")]),
        openai_tool_calls([("call_b", "lookup", "{}")]),
        error(500, "upstream exploded"),
    )
    _runaway(fake, "lookup")
    result = await _run(harness, workspace_id, _workflow({"maxModelCalls": 4}))

    assert result.status == "FAILED"
    assert result.run["error"]["code"] == "BUDGET_EXCEEDED"
    assert [s["attempt"] for s in result.step_runs] == [1, 2]  # the 500 was retried, the budget stop not
    assert [(c["round"], c["status"]) for c in result.llm_calls] == [
        (1, "completed"),
        (2, "completed"),
        (3, "failed"),
        (3, "completed"),
    ]
    assert len(ran) == 3 and len(fake.openai.requests) == 4
    assert result.event_types().count("STEP_RETRYING") == 1


async def test_pause_mode_waits_for_a_person_and_a_raise_resumes_the_run_to_completion(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    ran = _lookup(harness)
    _runaway(fake, "lookup")
    def_id = await create_definition(
        harness.rt, workspace_id, _workflow({"maxToolCalls": 2, "onBudgetExceeded": "pause"})
    )
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id, {"question": "go"})
    row = await harness.wait_for_status(run["id"], "WAITING", "FAILED", "COMPLETED")
    assert row["status"] == "WAITING" and row["lease_owner"] is None and row["next_run_at"] is None
    assert len(ran) == 2
    step = await harness.rt.pool.fetchrow("SELECT * FROM step_runs WHERE id = $1", row["current_step_run_id"])
    assert (step["status"], step["signal_type"]) == ("WAITING", "budget")
    paused = [e["payload"] for e in await harness.events(run["id"]) if e["event_type"] == "WORKFLOW_PAUSED"]
    assert paused[-1]["reason"] == "budget" and paused[-1]["budgetLimit"] == "maxToolCalls"
    assert paused[-1]["used"]["toolCalls"] == 2

    # A raise resumes it; the model gives up after one more tool round.
    fake.openai.responder = None
    fake.openai.enqueue(openai_tool_calls([("call_x", "lookup", "{}")]), openai_text("Done looking."))
    await update_budget(harness.rt, workspace_id, run["id"], Budget.model_validate({"maxToolCalls": 5}))
    row = await harness.wait_for_status(run["id"], "COMPLETED", "FAILED")
    result = await load_run(harness, run["id"])
    assert row["status"] == "COMPLETED", row["error"]
    assert result.state == {"agent": "Done looking."}
    assert len(ran) == 4  # the refused call of round 3 ran after the raise, then round 4's
    assert [(t["round"], t["status"]) for t in result.traces] == [(r, "completed") for r in (1, 2, 3, 4)]
    types = result.event_types()
    assert types.count("BUDGET_UPDATED") == 1
    resumed = result.events_of("WORKFLOW_RESUMED")
    assert resumed == [{"reason": "budget", "stepName": "agent"}]
    assert result.run["budget"] == {"maxToolCalls": 5, "onBudgetExceeded": "pause"}
    await assert_trace_event_consistency(harness, result.id)


async def test_a_run_without_a_budget_reads_no_usage_and_runs_as_before(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    ran = _lookup(harness)
    fake.openai.enqueue(openai_tool_calls([("call_1", "lookup", "{}")]), openai_text("ok"))
    result = await run_workflow(harness, workspace_id, llm_step(tools=["lookup"]))
    assert result.status == "COMPLETED" and len(ran) == 1
    assert result.run["budget"] is None


async def test_a_raise_that_lands_while_the_step_runs_is_seen_when_the_old_limit_is_reached(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    """The step holds the limits it read at its start; reaching one, it reads them again before
    stopping, and goes on from the committed rows when they were raised meanwhile."""
    ran: list[int] = []

    @harness.tools.tool
    async def lookup(ctx: ToolContext) -> str:
        """Look something up."""
        ran.append(1)
        if len(ran) == 1:  # a person raises the budget while the step runs
            await update_budget(
                harness.rt, workspace_id, ctx.workflow_run_id, Budget.model_validate({"maxToolCalls": 3})
            )
        return "more to look up"

    _runaway(fake, "lookup")
    result = await _run(harness, workspace_id, _workflow({"maxToolCalls": 2}))

    details = _assert_budget_failure(result, "maxToolCalls")
    assert len(ran) == 3 and details["max"] == 3
    assert [t["round"] for t in result.traces] == [1, 2, 3]
    # Every request the model got pairs each tool call with exactly one result, in order.
    for request in fake.openai.requests:
        messages = request.json["messages"]
        asked = [c["id"] for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or []]
        answered = [m["tool_call_id"] for m in messages if m["role"] == "tool"]
        assert asked == answered
    await assert_trace_event_consistency(harness, result.id)


async def test_a_raise_that_commits_between_the_last_read_and_the_wait_resumes_the_run(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders, monkeypatch: Any
) -> None:
    """The window a re-read cannot close: the step reads its limits, finds them unchanged, and a
    raise commits before the step's WAITING does. The WAITING transaction sees the raise and
    resumes the step at once, so the run does not wait for a raise that already happened."""
    ran = _lookup(harness)
    _runaway(fake, "lookup")
    reads = 0
    real_read = Meter.read.__func__  # type: ignore[attr-defined]

    async def read_then_raise(cls: type[Meter], pool: Any, run_id: str) -> Meter | None:
        nonlocal reads
        reads += 1
        meter = await real_read(cls, pool, run_id)
        if reads == 2:  # the re-read before stopping: the raise lands right after it
            fake.openai.responder = None
            fake.openai.enqueue(openai_tool_calls([("call_x", "lookup", "{}")]), openai_text("Done."))
            await update_budget(harness.rt, workspace_id, run_id, Budget.model_validate({"maxToolCalls": 5}))
        return meter

    monkeypatch.setattr(Meter, "read", classmethod(read_then_raise))
    def_id = await create_definition(
        harness.rt, workspace_id, _workflow({"maxToolCalls": 2, "onBudgetExceeded": "pause"})
    )
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id, {"question": "go"})
    row = await harness.wait_for_status(run["id"], "COMPLETED", "FAILED", timeout_s=30)
    assert row["status"] == "COMPLETED", row["error"]
    assert len(ran) == 4 and reads >= 2
    result = await load_run(harness, run["id"])
    assert result.state == {"agent": "Done."}
    # The timeline says what happened: the step stopped at the old limit and resumed at once.
    types = result.event_types()
    paused = types.index("WORKFLOW_PAUSED")
    assert types[paused + 1] == "WORKFLOW_RESUMED"
    assert result.events_of("WORKFLOW_RESUMED") == [{"reason": "budget", "stepName": "agent"}]
    (resumed,) = [e for e in await harness.events(run["id"]) if e["event_type"] == "WORKFLOW_RESUMED"]
    (paused,) = [e for e in await harness.events(run["id"]) if e["event_type"] == "WORKFLOW_PAUSED"]
    assert resumed["step_run_id"] == paused["step_run_id"] is not None  # the step that waited
    await assert_trace_event_consistency(harness, result.id)
