"""What the hostile-model suite (tests/e2e/hostile) found, pinned one by one (issue 18, item 8).

A model's answer is stored before anything else happens, and its tool calls are traced whatever
they say. Each of these answers used to fail the step with a database or encoder error (the call
never traced, the answer lost, the step retried), or to make the API or the UI answer 500 when
they read the run back.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from stevora.api import create_app
from stevora.definitions.budget import Budget
from stevora.engine import commands
from stevora.ids import new_id
from stevora.settings import Settings
from stevora.testing.fake_llm import (
    FakeLLMServer,
    anthropic_text,
    anthropic_tool_use,
    openai_text,
    openai_tool_calls,
)
from stevora.ui.auth import COOKIE_NAME
from tests.conftest import Harness, create_definition
from tests.integration.api.api_helpers import Tenant, bootstrap_tenant, make_client
from tests.integration.loop.conftest import SdkProviders, llm_step, load_run, openai_messages
from tests.integration.loop.test_loop_basics import assert_trace_event_consistency

REPLACEMENT = "\ufffd"


@pytest.fixture
async def api(harness: Harness, settings: Settings) -> AsyncIterator[tuple[httpx.AsyncClient, Tenant]]:
    async with make_client(create_app(settings, runtime=harness.rt)) as client:
        tenant = await bootstrap_tenant(client)
        client.cookies.set(COOKIE_NAME, tenant.key, path="/ui")
        yield client, tenant


def _register(harness: Harness, ran: list[dict[str, Any]]) -> None:
    @harness.tools.tool
    async def get_order(order_id: str) -> dict[str, Any]:
        """Look up an order."""
        ran.append({"order_id": order_id})
        return {"id": order_id}


async def _run(harness: Harness, workspace_id: str, **step: Any) -> Any:
    spec = {"name": "hostile", "version": "1", "steps": [llm_step(tools=["get_order"], **step)]}
    def_id = await create_definition(harness.rt, workspace_id, spec)
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id, {"question": "Order?"})
    row = await harness.wait_for_status(run["id"], "COMPLETED", "FAILED")
    return await load_run(harness, row["id"])


async def _reads_back(client: httpx.AsyncClient, tenant: Tenant, run_id: str) -> None:
    for url in (
        f"/v1/workflow-runs/{run_id}",
        f"/v1/workflow-runs/{run_id}/events",
        f"/v1/workflow-runs/{run_id}/tool-traces",
        f"/v1/workflow-runs/{run_id}/llm-calls",
        f"/ui/runs/{run_id}",
    ):
        response = await client.get(url, headers=tenant.headers)
        assert response.status_code == 200, (url, response.text[:300])


async def test_a_name_or_id_longer_than_its_column_is_traced_cut_and_refused(
    harness: Harness, fake: FakeLLMServer, sdk: SdkProviders, api: tuple[httpx.AsyncClient, Tenant]
) -> None:
    client, tenant = api
    ran: list[dict[str, Any]] = []
    _register(harness, ran)
    name, call_id = "get_order" * 10, "c" * 250
    fake.openai.enqueue(openai_tool_calls([(call_id, name, '{"order_id": "o_1"}')]), openai_text("No."))
    result = await _run(harness, tenant.workspace_id, globalTools=False)

    assert result.status == "COMPLETED", result.run["error"]
    assert ran == []
    (trace,) = result.traces
    assert (trace["tool_name"], trace["tool_call_id"]) == (name[:64], call_id[:200])
    assert (trace["status"], trace["error_code"]) == ("failed", "TOOL_NOT_OFFERED")
    # The model is answered (under the id the request gives its call: OpenAI takes 40 characters).
    sent = openai_messages(fake, 1)
    assert sent[-1]["tool_call_id"] == sent[-2]["tool_calls"][0]["id"]
    await assert_trace_event_consistency(harness, result.id)
    await _reads_back(client, tenant, result.id)


@pytest.mark.parametrize(
    ("text", "name", "arguments", "stored_text", "stored_name", "stored_input"),
    [
        pytest.param(
            "note\x00", "get_order\x00", '{"order_id": "o\\u0000"}',
            f"note{REPLACEMENT}", f"get_order{REPLACEMENT}", {"order_id": f"o{REPLACEMENT}"},
            id="nul",
        ),
        pytest.param(
            "half a pair \ud800", "get_order", '{"order_id": "o\\udfff"}',
            f"half a pair {REPLACEMENT}", "get_order", {"order_id": f"o{REPLACEMENT}"},
            id="lone-surrogate",
        ),
    ],
)  # fmt: skip
async def test_characters_postgresql_cannot_hold_are_stored_as_replacement_characters(
    harness: Harness,
    fake: FakeLLMServer,
    sdk: SdkProviders,
    api: tuple[httpx.AsyncClient, Tenant],
    text: str,
    name: str,
    arguments: str,
    stored_text: str,
    stored_name: str,
    stored_input: dict[str, Any],
) -> None:
    client, tenant = api
    ran: list[dict[str, Any]] = []
    _register(harness, ran)
    fake.openai.enqueue(openai_tool_calls([("call_1", name, arguments)], text=text), openai_text("Done."))
    result = await _run(harness, tenant.workspace_id, globalTools=False)

    assert result.status == "COMPLETED", result.run["error"]
    assert [s["attempt"] for s in result.step_runs] == [1]  # nothing raised, nothing retried
    first = result.llm_calls[0]["response"]
    assert first["text"] == stored_text
    assert first["toolCalls"][0]["name"] == stored_name
    (trace,) = result.traces
    assert (trace["tool_name"], trace["input_json"]) == (stored_name, stored_input)
    if name == "get_order":
        assert trace["status"] == "completed" and len(ran) == 1
    else:
        assert trace["error_code"] == "TOOL_NOT_OFFERED" and ran == []
    # The second request carried the answer as stored (the SDK could encode it).
    assert openai_messages(fake, 1)[-2]["content"] == stored_text
    await _reads_back(client, tenant, result.id)


@pytest.mark.parametrize("depth", [300, 5000], ids=["past-orjson-and-pydantic", "past-python-json"])
async def test_arguments_nested_too_deep_are_traced_as_the_models_string(
    harness: Harness,
    fake: FakeLLMServer,
    sdk: SdkProviders,
    api: tuple[httpx.AsyncClient, Tenant],
    depth: int,
) -> None:
    client, tenant = api
    ran: list[dict[str, Any]] = []
    _register(harness, ran)
    arguments = '{"order_id": ' + '{"a": ' * depth + "1" + "}" * depth + "}"
    fake.openai.enqueue(openai_tool_calls([("call_1", "get_order", arguments)]), openai_text("Done."))
    result = await _run(harness, tenant.workspace_id)

    assert result.status == "COMPLETED", result.run["error"]
    assert ran == []
    (trace,) = result.traces
    assert trace["input_json"] == {"raw": arguments}
    assert (trace["status"], trace["error_code"]) == ("failed", "INVALID_ARGUMENTS")
    await _reads_back(client, tenant, result.id)


async def test_the_run_page_shows_deep_arguments_of_a_round_never_run(
    harness: Harness, fake: FakeLLMServer, sdk: SdkProviders, api: tuple[httpx.AsyncClient, Tenant]
) -> None:
    """The round past maxToolRounds has no traces: the page renders the model's own string."""
    client, tenant = api
    _register(harness, [])
    deep = "[" * 5000 + "]" * 5000
    fake.openai.enqueue(
        openai_tool_calls([("call_1", "get_order", '{"order_id": "o_1"}')]),
        openai_tool_calls([("call_2", "get_order", deep)]),
    )
    result = await _run(harness, tenant.workspace_id, maxToolRounds=1)

    assert result.status == "FAILED" and result.run["error"]["code"] == "MAX_TOOL_ROUNDS"
    assert len(result.traces) == 1
    await _reads_back(client, tenant, result.id)


async def test_a_lone_surrogate_in_anthropic_tool_input_is_sent_back_as_a_replacement_character(
    harness: Harness, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    """The Anthropic wire sends `tool_use.input` back as an object parsed from the stored string."""
    ran: list[dict[str, Any]] = []
    _register(harness, ran)
    fake.anthropic.enqueue(
        anthropic_tool_use([("toolu_1", "get_order", {"order_id": "o\udfff"})]), anthropic_text("Done.")
    )
    ws = await _workspace(harness)
    result = await _run(harness, ws, model="claude-haiku-4-5")

    assert result.status == "COMPLETED", result.run["error"]
    assert [s["attempt"] for s in result.step_runs] == [1]
    assert ran == [{"order_id": f"o{REPLACEMENT}"}]  # the handler sees what its trace shows
    assert result.traces[0]["input_json"] == {"order_id": f"o{REPLACEMENT}"}
    sent = fake.anthropic.requests[1].json["messages"][1]["content"][0]
    assert sent["input"] == {"order_id": f"o{REPLACEMENT}"}


async def _workspace(harness: Harness) -> str:
    ws = new_id("ws")
    await harness.rt.pool.execute(
        "INSERT INTO workspaces (id, name, slug) VALUES ($1, 'hostile', $2)", ws, ws.replace("_", "-")
    )
    return ws


async def test_a_round_of_gated_calls_past_the_tool_budget_stops_the_run(
    harness: Harness, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    """The calls that wait for approval are handed over only when the whole round fits: with 1 of 2
    calls left the step stopped with a call left, found the budget unchanged and went on from the
    same rows, for ever (the run stayed RUNNING)."""
    ran: list[str] = []

    @harness.tools.tool(requires_approval=True)
    async def issue_refund(order_id: str, amount: int) -> str:
        """Refund an order."""
        ran.append(order_id)
        return "refunded"

    args = '{"order_id": "o_1", "amount": 5}'
    fake.openai.enqueue(
        openai_tool_calls([("call_1", "issue_refund", args), ("call_2", "issue_refund", args)])
    )
    ws = await _workspace(harness)
    spec = {"name": "hostile", "version": "1", "steps": [llm_step(tools=["issue_refund"])]}
    def_id = await create_definition(harness.rt, ws, spec)
    run, _ = await commands.create_run(
        harness.rt, ws, def_id, {"question": "Refund?"}, budget=Budget(max_tool_calls=1)
    )
    row = await harness.wait_for_status(run["id"], "COMPLETED", "FAILED", timeout_s=10)

    assert row["status"] == "FAILED" and row["error"]["code"] == "BUDGET_EXCEEDED", row["error"]
    assert row["error"]["details"]["used"]["toolCalls"] == 0
    assert ran == []
    assert (
        await harness.rt.pool.fetchval(
            "SELECT count(*) FROM approval_requests WHERE workflow_run_id = $1", run["id"]
        )
        == 0
    )
