"""Every way a tool call can fail becomes a failed trace row, a TOOL_CALL_FAILED event and an
`{"error": ...}` tool result the model sees — and the loop goes on (docs/tool-calling.md)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import pytest

from stevora.testing.fake_llm import (
    FakeLLMServer,
    anthropic_text,
    anthropic_tool_use,
    openai_text,
    openai_tool_calls,
)
from tests.conftest import Harness
from tests.integration.loop.conftest import (
    SdkProviders,
    anthropic_messages,
    error_json,
    llm_step,
    openai_messages,
    run_workflow,
    tool_def,
)
from tests.integration.loop.test_loop_basics import assert_trace_event_consistency

SEARCH_SCHEMA = {"query": {"type": "string"}, "limit": {"type": "integer"}}


@dataclass
class Case:
    tool: str
    arguments: str
    code: str
    model_sees: str  # the exact tool message content
    trace_error: str
    input_json: dict[str, Any]


def _register(harness: Harness, ran: list[str]) -> list[dict[str, Any]]:
    """Handlers for every case; returns the step's tool list."""

    async def search_kb(input: dict[str, Any]) -> list[str]:
        ran.append("search_kb")
        return ["kb-1"]

    async def crm_lookup(input: dict[str, Any]) -> dict[str, Any]:
        ran.append("crm_lookup")
        raise RuntimeError("CRM is down")

    async def slow_lookup(input: dict[str, Any]) -> str:
        ran.append("slow_lookup")
        await asyncio.sleep(5)
        ran.append("slow_lookup finished")
        return "late"

    async def dump_logs(input: dict[str, Any]) -> str:
        ran.append("dump_logs")
        return "x" * 1500

    @harness.tools.tool
    async def find_docs(query: str, limit: int = 3) -> list[str]:
        """Search the docs."""
        ran.append("find_docs")
        return [query]

    for handler in (search_kb, crm_lookup, slow_lookup, dump_logs):
        harness.tools.register(handler.__name__, handler)
    return [
        tool_def("search_kb", SEARCH_SCHEMA, ["query"]),
        tool_def("crm_lookup"),
        tool_def("slow_lookup"),
        tool_def("dump_logs"),
        tool_def("lookup_order", {"orderId": {"type": "string"}}),  # declared, no handler
        "find_docs",  # a registered @tool, referenced by name
    ]


CASES = {
    "declared_but_unregistered": Case(
        "lookup_order",
        '{"orderId": "o_1"}',
        "TOOL_NOT_REGISTERED",
        error_json("Tool 'lookup_order' not registered"),
        "Tool 'lookup_order' not registered",
        {"orderId": "o_1"},
    ),
    "unknown_tool_name": Case(
        "drop_tables",
        "{}",
        "TOOL_NOT_OFFERED",
        error_json(
            "Tool 'drop_tables' is not offered in this step "
            "(offered: crm_lookup, dump_logs, find_docs, lookup_order, search_kb, slow_lookup)"
        ),
        "Tool 'drop_tables' is not offered in this step "
        "(offered: crm_lookup, dump_logs, find_docs, lookup_order, search_kb, slow_lookup)",
        {},
    ),
    "schema_invalid_arguments": Case(
        "search_kb",
        '{"limit": "ten"}',
        "INVALID_ARGUMENTS",
        error_json(
            "Invalid arguments for tool 'search_kb': limit: 'ten' is not of type 'integer'; "
            "query: 'query' is a required property"
        ),
        "Invalid arguments for tool 'search_kb': limit: 'ten' is not of type 'integer'; "
        "query: 'query' is a required property",
        {"limit": "ten"},
    ),
    "bad_json_for_typed_tool": Case(
        "find_docs",
        '{"query": "refunds',
        "INVALID_ARGUMENTS",
        error_json(
            "Invalid arguments for tool 'find_docs': raw: unexpected argument; "
            "query: missing required argument"
        ),
        "Invalid arguments for tool 'find_docs': raw: unexpected argument; query: missing required argument",
        {"raw": '{"query": "refunds'},
    ),
    "raising_handler": Case(
        "crm_lookup",
        "{}",
        "TOOL_ERROR",
        error_json("CRM is down"),
        "RuntimeError: CRM is down",
        {},
    ),
    "timeout": Case(
        "slow_lookup",
        "{}",
        "TOOL_TIMEOUT",
        error_json("Tool 'slow_lookup' timed out after 0.2s"),
        "Tool 'slow_lookup' timed out after 0.2s",
        {},
    ),
    "oversized_output": Case(
        "dump_logs",
        "{}",
        "TOOL_OUTPUT_TOO_LARGE",
        error_json("Tool output is 1500 bytes, over the 1000-byte limit"),
        "Tool output is 1500 bytes, over the 1000-byte limit",
        {},
    ),
}


@pytest.mark.parametrize("case_name", list(CASES))
async def test_failed_tool_call_is_traced_and_returned_to_the_model(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders, case_name: str
) -> None:
    case = CASES[case_name]
    ran: list[str] = []
    tools = _register(harness, ran)
    harness.rt.settings = harness.rt.settings.model_copy(update={"max_tool_output_bytes": 1000})
    fake.openai.enqueue(
        openai_tool_calls([("call_1", case.tool, case.arguments)]),
        openai_text("Sorry, I could not do that."),
    )
    result = await run_workflow(harness, workspace_id, llm_step(tools=tools, toolTimeoutMs=200))

    assert result.status == "COMPLETED", result.run["error"]  # one failed tool never fails the step
    assert result.state == {"agent": "Sorry, I could not do that."}
    (trace,) = result.traces
    assert trace["status"] == "failed"
    assert trace["error_code"] == case.code
    assert trace["error"] == case.trace_error
    assert trace["input_json"] == case.input_json
    assert trace["output_json"] is None
    assert trace["result_text"] == case.model_sees
    assert (trace["tool_name"], trace["tool_call_id"], trace["sequence"]) == (case.tool, "call_1", 0)
    if case.code in ("TOOL_NOT_REGISTERED", "TOOL_NOT_OFFERED", "INVALID_ARGUMENTS"):
        assert ran == []  # the handler never ran
    elif case.code == "TOOL_TIMEOUT":
        await asyncio.sleep(0)
        assert ran == ["slow_lookup"]  # cancelled, never finished
        assert 200 <= trace["duration_ms"] < 1500

    (failed,) = result.events_of("TOOL_CALL_FAILED")
    assert failed["toolTraceId"] == trace["id"]
    assert failed["errorCode"] == case.code and failed["error"] == case.trace_error
    assert "TOOL_CALL_COMPLETED" not in result.event_types()
    assert result.event_types()[-3:] == ["LLM_CALL_COMPLETED", "STEP_COMPLETED", "WORKFLOW_COMPLETED"]

    tool_message = openai_messages(fake, 1)[-1]
    assert tool_message == {"role": "tool", "tool_call_id": "call_1", "content": case.model_sees}
    await assert_trace_event_consistency(harness, result.id)


async def test_unparseable_arguments_reach_an_input_handler_as_raw(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    received: list[dict[str, Any]] = []

    async def search_kb(input: dict[str, Any]) -> dict[str, Any]:
        received.append(input)
        return {"echo": input}

    harness.tools.register("search_kb", search_kb)
    broken = '{"query": "refunds", limit: 3'
    fake.openai.enqueue(openai_tool_calls([("call_1", "search_kb", broken)]), openai_text("ok"))
    step = llm_step(tools=[tool_def("search_kb", SEARCH_SCHEMA, ["query"])])
    result = await run_workflow(harness, workspace_id, step)

    assert result.status == "COMPLETED", result.run["error"]
    assert received == [{"raw": broken}]  # not validated against the schema
    (trace,) = result.traces
    assert trace["status"] == "completed" and trace["input_json"] == {"raw": broken}
    assert trace["output_json"] == {"echo": {"raw": broken}}
    assert result.events_of("TOOL_CALL_COMPLETED")[0]["toolTraceId"] == trace["id"]
    history = openai_messages(fake, 1)
    assert history[1]["tool_calls"][0]["function"]["arguments"] == broken  # sent back as the model wrote it
    assert json.loads(history[2]["content"]) == {"echo": {"raw": broken}}
    await assert_trace_event_consistency(harness, result.id)


async def test_anthropic_sees_a_failed_call_as_an_error_tool_result_next_to_a_good_one(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    ran: list[str] = []
    tools = _register(harness, ran)
    fake.anthropic.enqueue(
        anthropic_tool_use([("toolu_a", "crm_lookup", {}), ("toolu_b", "search_kb", {"query": "refunds"})]),
        anthropic_text("The CRM is down, but the knowledge base says kb-1."),
    )
    result = await run_workflow(harness, workspace_id, llm_step(model="claude-haiku-4-5", tools=tools))

    assert result.status == "COMPLETED", result.run["error"]
    assert sorted(ran) == ["crm_lookup", "search_kb"]
    assert [(t["tool_name"], t["status"], t["error_code"]) for t in result.traces] == [
        ("crm_lookup", "failed", "TOOL_ERROR"),
        ("search_kb", "completed", None),
    ]
    assert result.event_types().count("TOOL_CALL_FAILED") == 1
    assert result.event_types().count("TOOL_CALL_COMPLETED") == 1
    results = anthropic_messages(fake, 1)[2]["content"]
    assert results == [
        {
            "type": "tool_result",
            "tool_use_id": "toolu_a",
            "content": error_json("CRM is down"),
            "is_error": True,
        },
        {"type": "tool_result", "tool_use_id": "toolu_b", "content": '["kb-1"]'},
    ]
    await assert_trace_event_consistency(harness, result.id)


async def test_tool_referenced_by_name_sends_the_registered_schema(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    ran: list[str] = []
    _register(harness, ran)
    fake.openai.enqueue(
        openai_tool_calls([("call_1", "find_docs", '{"query": "sso"}')]), openai_text("SSO is documented.")
    )
    result = await run_workflow(harness, workspace_id, llm_step(tools=["find_docs"]))

    assert result.status == "COMPLETED", result.run["error"]
    assert ran == ["find_docs"]
    (sent,) = fake.openai.requests[0].json["tools"]
    registered = harness.tools.get("find_docs")
    assert registered is not None
    assert sent["function"] == {
        "name": "find_docs",
        "description": "Search the docs.",
        "parameters": registered.parameters,
    }
    assert registered.parameters["required"] == ["query"]
    assert registered.parameters["properties"]["limit"]["type"] == "integer"
    (trace,) = result.traces
    assert trace["status"] == "completed" and trace["output_json"] == ["sso"]
    assert result.events_of("TOOL_CALL_COMPLETED")[0]["toolTraceId"] == trace["id"]
    assert openai_messages(fake, 1)[-1]["content"] == '["sso"]'
    await assert_trace_event_consistency(harness, result.id)


async def test_reference_to_an_unregistered_tool_fails_before_any_model_call(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    result = await run_workflow(harness, workspace_id, llm_step(tools=["not_loaded"]))

    assert result.status == "FAILED"
    assert result.run["error"]["code"] == "TOOL_NOT_REGISTERED"
    assert "stevora worker --tools" in result.run["error"]["message"]
    assert "STEP_RETRYING" not in result.event_types()  # retrying cannot load the module
    assert result.llm_calls == [] and result.traces == [] and fake.requests == []
    await assert_trace_event_consistency(harness, result.id)
