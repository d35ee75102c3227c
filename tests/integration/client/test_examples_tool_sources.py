"""The tool-source examples of docs/tool-calling.md, run against the harness stack with the Python
client: tools by name (`@tool` and `register_tool`), client-executed tools driven by
`examples/client_tools.py`, and workflows as tools (`inputSchema`, `defaultParams`)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

import examples.tools as example_tools
from examples import client_tools
from stevora.client import AgentRuntime, AsyncAgentRuntime
from stevora.llm.scripted_provider import ScriptedProvider
from tests.conftest import Harness

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
# The Dagu example of docs/definitions.md ("The run input"), as the model is sent it.
WEB_SEARCH_PARAMETERS = {
    "type": "object",
    "properties": {
        "query": {"type": "string"},
        "max_results": {"type": "integer", "default": 10},
        "include_images": {"type": "boolean", "default": False},
        "temperature": {"type": "number", "default": 0.7},
    },
    "required": ["query"],
}


def example(name: str) -> dict[str, Any]:
    spec: dict[str, Any] = json.loads((EXAMPLES / name).read_text())
    return spec


@pytest.fixture(autouse=True)
def offline_openai(harness: Harness) -> ScriptedProvider:
    """The examples name `gpt-4o-mini`; as under `stevora dev` without a key, the scripted agent answers."""
    provider = ScriptedProvider(name="openai")
    harness.rt.providers.register("openai", provider)
    return provider


async def test_support_agent_offers_registered_tools_by_name(
    client: AsyncAgentRuntime, harness: Harness
) -> None:
    harness.tools.tool(example_tools.search_knowledge_base)
    harness.tools.tool(example_tools.get_customer_data)
    harness.tools.register(
        "convert_currency",
        example_tools.convert_currency,
        description="Convert an amount to US dollars.",
        parameters=example_tools.CONVERT_CURRENCY_PARAMETERS,
    )
    definition = await client.definitions.apply(example("support-agent.json"))
    run = await client.workflows.create(definition.id, {"question": "Refund policy?", "customerId": "cus_42"})
    done = await client.workflows.wait_for_completion(run.id, timeout=20, poll_interval=0.05)
    assert done.status == "COMPLETED", done.error
    traces = {t.tool_name: t for t in await client.workflows.tool_traces(run.id)}
    assert sorted(traces) == ["convert_currency", "get_customer_data", "search_knowledge_base"]
    assert all(t.status == "completed" for t in traces.values())
    assert "usd" in traces["convert_currency"].output_json
    assert traces["get_customer_data"].output_json["name"] == "Acme Corp"
    assert done.output is not None and done.output["answer"]


async def test_client_tools_example_answers_the_calls_itself_until_the_run_ends(
    client: AsyncAgentRuntime, harness: Harness, server_url: str, api_key: str
) -> None:
    def drive() -> Any:
        with AgentRuntime(api_key, base_url=server_url) as rt:
            return client_tools.drive(rt, timeout_s=20, poll_s=0.05)

    done = await asyncio.to_thread(drive)
    assert done.status == "COMPLETED", done.error
    assert done.required_action is None and done.output is not None and done.output["advice"]
    traces = {t.tool_name: t for t in await client.workflows.tool_traces(done.id)}
    assert traces["get_location"].output_json == {"city": "Lisbon"}
    assert traces["get_weather"].status == "completed" and "tempC" in traces["get_weather"].output_json
    events = [e.event_type async for e in client.workflows.iter_events(done.id)]
    assert "WORKFLOW_PAUSED" in events and events.count("TOOL_CALL_COMPLETED") == 2


async def test_research_lead_calls_two_workflows_as_tools(
    client: AsyncAgentRuntime, harness: Harness, offline_openai: ScriptedProvider
) -> None:
    harness.tasks.register("web_search", example_tools.web_search)
    harness.tasks.register("lookup_account", example_tools.lookup_account)
    await client.definitions.apply(example("web-search.json"))
    await client.definitions.apply(example("account-lookup.json"))
    definition = await client.definitions.apply(example("research-lead.json"))
    run = await client.workflows.create(definition.id, {"company": "Acme Corp", "customerId": "cus_42"})
    done = await client.workflows.wait_for_completion(run.id, timeout=30, poll_interval=0.05)
    assert done.status == "COMPLETED", done.error

    # What the model was offered: the child definitions' input schemas and descriptions.
    offered = {t.name: t for t in offline_openai.requests[0].tools}
    assert offered["web_search"].parameters == WEB_SEARCH_PARAMETERS
    assert offered["web_search"].description == example("web-search.json")["description"]
    assert offered["account_lookup"].parameters == example("account-lookup.json")["inputSchema"]
    assert offered["account_lookup"].description.startswith("The customer's account in our CRM")

    traces = {t.tool_name: t for t in await client.workflows.tool_traces(run.id)}
    children = {c.id: c for c in (await client.workflows.list(parent_run_id=run.id)).data}
    assert {t.child_run_id for t in traces.values()} == set(children)
    assert traces["account_lookup"].output_json == {"account": example_tools.CUSTOMERS["cus_42"]}
    assert traces["web_search"].output_json["total"] == traces["web_search"].input_json.get("max_results", 10)
    assert all(c.status == "COMPLETED" and c.parent_run_id == run.id for c in children.values())
