"""Tools that act on the run, over HTTP: `tool` steps, tools reading and updating run state, output
schemas, global tools and approval-gated tool calls."""

from __future__ import annotations

import json
import typing
from typing import Any

import httpx
import typing_extensions
from api_helpers import DefinitionFactory, Tenant
from pydantic import BaseModel
from test_api_tool_outputs import start, wait_for

from stevora.tasks import StepResult
from stevora.tools import ToolContext
from tests.conftest import Harness


def agent(*tools: Any, **extra: Any) -> dict[str, Any]:
    return {
        "type": "llm",
        "name": "agent",
        "model": "scripted",
        "messages": [{"role": "user", "content": "Do it"}],
        "tools": list(tools),
        **extra,
    }


async def traces(client: httpx.AsyncClient, tenant: Tenant, run_id: str) -> list[dict[str, Any]]:
    response = await client.get(f"/v1/workflow-runs/{run_id}/tool-traces", headers=tenant.headers)
    data: list[dict[str, Any]] = response.json()["data"]
    return data


async def test_a_tool_step_runs_with_typed_input_from_an_earlier_steps_output(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Harness
) -> None:
    calls: list[tuple[dict[str, Any], str]] = []

    async def research(ctx: Any) -> StepResult:
        return StepResult(output={"plan": {"tier": "pro", "seats": 12}})

    async def get_customer_data(input: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        calls.append((input, ctx.idempotency_key))
        return {"customerId": input["customerId"], "seats": input["plan"]["seats"]}

    harness.tasks.register("research", research)
    harness.tools.register(
        "get_customer_data",
        get_customer_data,
        parameters={
            "type": "object",
            "properties": {
                "customerId": {"type": "string"},
                "plan": {"type": "object"},
                "vip": {"type": "boolean"},
            },
            "required": ["customerId", "plan"],
        },
    )
    step = {
        "type": "tool",
        "name": "fetch-customer",
        "tool": "get_customer_data",
        "input": {
            "customerId": "{{input.customerId}}",
            "plan": "{{steps.research.output.plan}}",
            "vip": "{{input.vip}}",
        },
        "outputKey": "customer",
    }
    run_id = await start_with(
        client,
        tenant,
        await define([{"type": "task", "name": "research", "handler": "research"}, step]),
        {"customerId": "cus_42", "vip": True},
    )
    done = await wait_for(client, tenant, run_id, "COMPLETED", "FAILED")
    assert done["status"] == "COMPLETED", done["error"]
    step_run = done["stepRuns"][-1]
    # Exactly-one-template values kept their JSON types (an object, a boolean).
    assert calls[0][0] == {"customerId": "cus_42", "plan": {"tier": "pro", "seats": 12}, "vip": True}
    assert calls[0][1] == f"{step_run['id']}:tool"
    assert done["state"]["customer"] == {"customerId": "cus_42", "seats": 12}
    (trace,) = await traces(client, tenant, run_id)
    assert trace["llmCallId"] is None and trace["toolName"] == "get_customer_data"
    assert trace["idempotencyKey"] == f"{step_run['id']}:tool" and trace["status"] == "completed"
    assert [e["event_type"] for e in await harness.events(run_id)].count("TOOL_CALL_COMPLETED") == 1


async def start_with(
    client: httpx.AsyncClient, tenant: Tenant, definition_id: str, input: dict[str, Any]
) -> str:
    response = await client.post(
        "/v1/workflow-runs", json={"definitionId": definition_id, "input": input}, headers=tenant.headers
    )
    assert response.status_code == 201, response.text
    run_id: str = response.json()["data"]["id"]
    return run_id


async def test_a_tool_step_fails_clearly_on_a_missing_path_a_bad_input_or_an_unregistered_tool(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Harness
) -> None:
    harness.tools.register(
        "needs_int",
        lambda input: input,
        parameters={"type": "object", "properties": {"n": {"type": "integer"}}},
    )
    cases = {
        "TEMPLATE_PATH_MISSING": {"tool": "needs_int", "input": {"n": "{{input.nowhere}}"}},
        "INVALID_ARGUMENTS": {"tool": "needs_int", "input": {"n": "{{input.word}}"}},
        "TOOL_NOT_REGISTERED": {"tool": "not_here", "input": {}},
    }
    for code, fields in cases.items():
        run_id = await start_with(
            client, tenant, await define([{"type": "tool", "name": "t", **fields}]), {"word": "seven"}
        )
        failed = await wait_for(client, tenant, run_id, "FAILED", "COMPLETED")
        assert failed["status"] == "FAILED" and failed["error"]["code"] == code, failed["error"]
        assert failed["error"]["attempts"] == 1, "a definition problem is not retried"
    missing = failed = await wait_for(client, tenant, run_id, "FAILED")
    assert missing["error"]["code"] == "TOOL_NOT_REGISTERED"


async def test_tools_read_the_run_and_update_its_state_once_and_only_when_they_succeed(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Harness
) -> None:
    async def remember(input: dict[str, Any], ctx: ToolContext) -> str:
        assert ctx.run_input["user"] == "ada" and ctx.step_name == "agent"
        ctx.update_state({"seen": [*ctx.state.get("seen", []), "remember"], "user": ctx.run_input["user"]})
        return "noted"

    async def explode(input: dict[str, Any], ctx: ToolContext) -> str:
        ctx.update_state({"exploded": True})
        raise RuntimeError("boom")

    harness.tools.register("remember", remember)
    harness.tools.register("explode", explode)
    run_id = await start_with(client, tenant, await define([agent("remember", "explode")]), {"user": "ada"})
    done = await wait_for(client, tenant, run_id, "COMPLETED", "FAILED")
    assert done["state"]["seen"] == ["remember"] and done["state"]["user"] == "ada"
    assert "exploded" not in done["state"], "a failed call applies none of its state updates"
    events = {
        e["payload"]["toolName"]: e
        for e in await harness.events(run_id)
        if e["event_type"].startswith("TOOL_CALL")
    }
    assert events["remember"]["payload"]["stateKeys"] == ["seen", "user"]
    assert "stateKeys" not in events["explode"]["payload"]


class Forecast(BaseModel):
    city: str
    celsius: float


async def test_an_output_that_breaks_the_output_schema_is_a_failed_call_returned_to_the_model(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Harness
) -> None:
    @harness.tools.tool
    async def forecast(city: str) -> Forecast:
        """Weather for a city."""
        return {"city": city, "celsius": "warm"}  # type: ignore[return-value]

    inline = {
        "name": "headline",
        "description": "Today's headline",
        "parameters": {"type": "object", "properties": {}},
        "outputSchema": {
            "type": "object",
            "properties": {"title": {"type": "string"}},
            "required": ["title"],
        },
    }
    harness.tools.register("headline", lambda input: {"headline": "no title key"})
    run_id = await start(client, tenant, await define([agent("forecast", inline)]))
    await wait_for(client, tenant, run_id, "COMPLETED")
    by_name = {t["toolName"]: t for t in await traces(client, tenant, run_id)}
    assert (
        by_name["forecast"]["status"] == "failed"
        and by_name["forecast"]["errorCode"] == "TOOL_OUTPUT_INVALID"
    )
    assert "celsius" in by_name["forecast"]["error"]
    assert (
        by_name["headline"]["errorCode"] == "TOOL_OUTPUT_INVALID" and "title" in by_name["headline"]["error"]
    )
    results = [json.loads(m.content) for m in harness.scripted.requests[-1].messages if m.role == "tool"]
    assert all("error" in r for r in results)


class Shipment(typing.TypedDict):
    tracking: str
    days: int


class Invoice(typing_extensions.TypedDict):
    total_cents: int


async def test_a_result_breaking_a_typeddict_return_type_is_recorded_failed_and_applies_no_state(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Harness
) -> None:
    """Both kinds of TypedDict give an output schema on Python 3.11 (pydantic refuses
    `typing.TypedDict` there, and `typing.is_typeddict` misses `typing_extensions` ones)."""

    @harness.tools.tool
    async def ship(order: str, ctx: ToolContext) -> Shipment:
        """Ship an order."""
        ctx.update_state({"shipped": order})
        return {"tracking": "T1", "days": "soon"}  # type: ignore[typeddict-item]

    @harness.tools.tool
    async def invoice(order: str, ctx: ToolContext) -> Invoice:
        """Invoice an order."""
        ctx.update_state({"invoiced": order})
        return {"total": 12}  # type: ignore[typeddict-unknown-key]

    run_id = await start(client, tenant, await define([agent("ship", "invoice")]))
    done = await wait_for(client, tenant, run_id, "COMPLETED")
    by_name = {t["toolName"]: t for t in await traces(client, tenant, run_id)}
    assert by_name["ship"]["status"] == "failed" and by_name["ship"]["errorCode"] == "TOOL_OUTPUT_INVALID"
    assert "days" in by_name["ship"]["error"]
    assert by_name["invoice"]["status"] == "failed"
    assert by_name["invoice"]["errorCode"] == "TOOL_OUTPUT_INVALID"
    assert "total_cents" in by_name["invoice"]["error"]
    assert "shipped" not in done["state"] and "invoiced" not in done["state"]


async def test_a_global_tool_is_offered_to_every_llm_step_unless_it_opts_out(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Harness
) -> None:
    harness.tools.register("current_time", lambda input: "12:00", global_=True)
    harness.tools.register("lookup", lambda input: "found")
    run_id = await start(client, tenant, await define([agent("lookup")]))
    await wait_for(client, tenant, run_id, "COMPLETED")
    offered = [t.name for t in harness.scripted.requests[0].tools]
    assert offered == ["lookup", "current_time"]
    call = await harness.rt.pool.fetchrow(
        "SELECT request FROM llm_calls WHERE workflow_run_id = $1 ORDER BY round", run_id
    )
    assert call["request"]["tools"] == ["lookup", "current_time"], "the step's tool panel shows it"

    opted_out = await start(client, tenant, await define([agent("lookup", globalTools=False)]))
    await wait_for(client, tenant, opted_out, "COMPLETED")
    assert [t.name for t in harness.scripted.requests[-1].tools] == ["lookup"]


async def gated_run(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Harness, ran: list[Any]
) -> tuple[str, dict[str, Any]]:
    async def refund(input: dict[str, Any]) -> dict[str, Any]:
        ran.append(input)
        return {"refunded": input["amount"]}

    harness.tools.register(
        "refund",
        refund,
        parameters={"type": "object", "properties": {"amount": {"type": "integer"}}, "required": ["amount"]},
        requires_approval=True,
    )
    run_id = await start(client, tenant, await define([agent("refund")]))
    await wait_for(client, tenant, run_id, "WAITING")
    approvals = (await client.get("/v1/approval-requests?pending=true", headers=tenant.headers)).json()[
        "data"
    ]
    (approval,) = [a for a in approvals if a["workflowRunId"] == run_id]
    assert ran == [], "a gated call does not run before a person decides"
    assert approval["content"]["tool"] == "refund" and approval["awaitedToolCallId"]
    assert set(approval["content"]) == {"tool", "arguments", "toolCallId"}
    return run_id, approval


async def decide(
    client: httpx.AsyncClient, tenant: Tenant, approval: dict[str, Any], **body: Any
) -> httpx.Response:
    return await client.post(
        f"/v1/approval-requests/{approval['id']}/decide", json=body, headers=tenant.headers
    )


async def test_an_approved_gated_call_runs_with_the_models_arguments(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Harness
) -> None:
    ran: list[Any] = []
    run_id, approval = await gated_run(client, tenant, define, harness, ran)
    assert (await decide(client, tenant, approval, decision="approved", decidedBy="ann")).status_code == 200
    await wait_for(client, tenant, run_id, "COMPLETED")
    assert ran == [approval["content"]["arguments"]]
    (trace,) = await traces(client, tenant, run_id)
    assert trace["status"] == "completed"


async def test_an_edited_gated_call_runs_with_the_edited_arguments_checked_at_decision_time(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Harness
) -> None:
    ran: list[Any] = []
    run_id, approval = await gated_run(client, tenant, define, harness, ran)
    bad = await decide(client, tenant, approval, decision="edited", editedContent={"amount": "lots"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "VALIDATION_ERROR"
    assert "amount" in bad.json()["error"]["message"]
    still = (await client.get(f"/v1/approval-requests/{approval['id']}", headers=tenant.headers)).json()[
        "data"
    ]
    assert still["status"] == "PENDING", "a bad edit records nothing"
    ok = await decide(client, tenant, approval, decision="edited", editedContent={"amount": 5})
    assert ok.status_code == 200, ok.text
    await wait_for(client, tenant, run_id, "COMPLETED")
    assert ran == [{"amount": 5}]


async def test_a_rejected_gated_call_gives_the_model_an_error_saying_a_person_declined(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Harness
) -> None:
    ran: list[Any] = []
    run_id, approval = await gated_run(client, tenant, define, harness, ran)
    assert (await decide(client, tenant, approval, decision="rejected", decidedBy="bob")).status_code == 200
    done = await wait_for(client, tenant, run_id, "COMPLETED", "FAILED")
    assert done["status"] == "COMPLETED" and ran == []
    (trace,) = await traces(client, tenant, run_id)
    assert trace["status"] == "failed" and trace["errorCode"] == "APPROVAL_REJECTED"
    result = next(m for m in harness.scripted.requests[-1].messages if m.role == "tool")
    assert "declined" in json.loads(result.content)["error"]


async def test_a_gated_tool_in_a_tool_step_waits_for_the_decision_and_a_rejection_fails_the_step(
    client: httpx.AsyncClient, tenant: Tenant, define: DefinitionFactory, harness: Harness
) -> None:
    ran: list[Any] = []

    async def wire_money(input: dict[str, Any]) -> dict[str, Any]:
        ran.append(input)
        return {"sent": input["amount"]}

    harness.tools.register(
        "wire_money",
        wire_money,
        parameters={"type": "object", "properties": {"amount": {"type": "integer"}}, "required": ["amount"]},
        requires_approval=True,
    )
    step = {"type": "tool", "name": "pay", "tool": "wire_money", "input": {"amount": "{{input.amount}}"}}
    definition = await define([step])

    async def pending_for(run_id: str) -> dict[str, Any]:
        await wait_for(client, tenant, run_id, "WAITING")
        approvals = (await client.get("/v1/approval-requests?pending=true", headers=tenant.headers)).json()[
            "data"
        ]
        (approval,) = [a for a in approvals if a["workflowRunId"] == run_id]
        return approval

    approved_run = await start_with(client, tenant, definition, {"amount": 40})
    approval = await pending_for(approved_run)
    assert approval["content"] == {
        "tool": "wire_money",
        "arguments": {"amount": 40},
        "toolCallId": "step:pay",
    }
    assert ran == []
    assert (await decide(client, tenant, approval, decision="approved")).status_code == 200
    done = await wait_for(client, tenant, approved_run, "COMPLETED", "FAILED")
    assert done["status"] == "COMPLETED" and done["state"]["pay"] == {"sent": 40} and ran == [{"amount": 40}]

    rejected_run = await start_with(client, tenant, definition, {"amount": 9000})
    approval = await pending_for(rejected_run)
    assert (await decide(client, tenant, approval, decision="rejected", decidedBy="cfo")).status_code == 200
    failed = await wait_for(client, tenant, rejected_run, "FAILED", "COMPLETED")
    assert failed["status"] == "FAILED" and failed["error"]["code"] == "APPROVAL_REJECTED"
    assert failed["error"]["attempts"] == 1, "a person's no is not retried"
    assert ran == [{"amount": 40}]
