"""The tool boundary: a model runs only the tools its step offers (issue 18, item 1).

A call of any other name — a tool registered in the worker but not offered, a global tool in a
step with `globalTools: false`, an approval-gated tool the step did not offer, a look-alike or
case variant of an offered name, an empty name — never executes: it is traced as failed with
`TOOL_NOT_OFFERED`, the model gets an error result it can read, and the run goes on.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from stevora.engine import commands
from stevora.testing.fake_llm import FakeLLMServer, openai_text, openai_tool_calls
from tests.conftest import Harness, create_definition
from tests.integration.loop.conftest import SdkProviders, llm_step, openai_messages, run_workflow, tool_def
from tests.integration.loop.test_loop_basics import assert_trace_event_consistency


def _register(harness: Harness, ran: list[str]) -> None:
    @harness.tools.tool
    async def get_order(order_id: str) -> dict[str, Any]:
        """Look up an order."""
        ran.append("get_order")
        return {"id": order_id, "total": 40}

    @harness.tools.tool
    async def calculate_sum(a: int, b: int) -> int:
        """Add two numbers."""
        ran.append("calculate_sum")
        return a + b

    @harness.tools.tool(global_=True)
    async def current_time() -> str:
        """The time now."""
        ran.append("current_time")
        return "12:00"

    @harness.tools.tool(requires_approval=True)
    async def issue_refund(order_id: str, amount: int) -> str:
        """Refund an order."""
        ran.append(f"issue_refund:{amount}")
        return "refunded"


NOT_OFFERED = {
    "registered_but_not_offered": "calculate_sum",
    "global_tool_with_global_tools_off": "current_time",
    "approval_gated_not_offered": "issue_refund",
    "case_variant_of_offered": "Get_Order",
    "look_alike_with_trailing_space": "get_order ",
    "look_alike_with_unicode_digit": "get_order\u0661",
    "empty_name": "",
}


@pytest.mark.parametrize("case", list(NOT_OFFERED))
async def test_a_tool_the_step_does_not_offer_never_runs(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders, case: str
) -> None:
    ran: list[str] = []
    _register(harness, ran)
    name = NOT_OFFERED[case]
    fake.openai.enqueue(
        openai_tool_calls([("call_1", name, '{"order_id": "o_1", "amount": 999, "a": 1, "b": 2}')]),
        openai_text("I cannot do that."),
    )
    result = await run_workflow(harness, workspace_id, llm_step(tools=["get_order"], globalTools=False))

    assert result.status == "COMPLETED", result.run["error"]
    assert ran == []  # nothing ran, the gated refund least of all
    (trace,) = result.traces
    assert (trace["tool_name"], trace["status"], trace["error_code"]) == (name, "failed", "TOOL_NOT_OFFERED")
    assert trace["error"] == f"Tool {name!r} is not offered in this step (offered: get_order)"
    (failed,) = result.events_of("TOOL_CALL_FAILED")
    assert failed["errorCode"] == "TOOL_NOT_OFFERED"
    # No approval was asked for a tool the step never offered.
    assert (
        await harness.rt.pool.fetchval(
            "SELECT count(*) FROM approval_requests WHERE workflow_run_id = $1", result.id
        )
        == 0
    )
    tool_message = openai_messages(fake, 1)[-1]
    assert tool_message["role"] == "tool" and tool_message["tool_call_id"] == "call_1"
    assert "not offered" in json.loads(tool_message["content"])["error"]
    await assert_trace_event_consistency(harness, result.id)


async def test_offered_calls_in_the_same_round_still_run(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    ran: list[str] = []
    _register(harness, ran)
    fake.openai.enqueue(
        openai_tool_calls(
            [
                ("call_1", "issue_refund", '{"order_id": "o_1", "amount": 999}'),
                ("call_2", "get_order", '{"order_id": "o_1"}'),
                ("call_3", "current_time", "{}"),
            ]
        ),
        openai_text("Order o_1 totals 40."),
    )
    # Global tools are on by default: current_time is offered here.
    result = await run_workflow(harness, workspace_id, llm_step(tools=["get_order"]))

    assert result.status == "COMPLETED", result.run["error"]
    assert sorted(ran) == ["current_time", "get_order"]
    assert [(t["tool_name"], t["error_code"]) for t in result.traces] == [
        ("issue_refund", "TOOL_NOT_OFFERED"),
        ("get_order", None),
        ("current_time", None),
    ]
    await assert_trace_event_consistency(harness, result.id)


async def test_an_inline_tool_with_a_gated_handler_still_waits_for_approval(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    """Offering the gated tool under an inline schema does not drop its gate."""
    ran: list[str] = []
    _register(harness, ran)
    fake.openai.enqueue(openai_tool_calls([("call_1", "issue_refund", '{"order_id": "o_1", "amount": 999}')]))
    spec = {
        "name": "loop-test",
        "version": "1",
        "steps": [
            llm_step(
                tools=[
                    tool_def("issue_refund", {"order_id": {"type": "string"}, "amount": {"type": "integer"}})
                ]
            )
        ],
    }
    def_id = await create_definition(harness.rt, workspace_id, spec)
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id, {"question": "refund"})
    row = await harness.wait_for_status(run["id"], "WAITING")
    assert row["status"] == "WAITING"
    assert ran == []
    assert (
        await harness.rt.pool.fetchval(
            "SELECT count(*) FROM approval_requests WHERE workflow_run_id = $1 AND status = 'PENDING'",
            run["id"],
        )
        == 1
    )
