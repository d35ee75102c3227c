"""OpenTelemetry spans of a run: the GenAI span tree, one trace across executions, content opt-in."""

from __future__ import annotations

import asyncio
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from stevora.observability import tracing
from stevora.testing.fake_llm import FakeLLMServer, openai_text, openai_tool_calls
from tests.conftest import Harness
from tests.integration.loop.conftest import SdkProviders, llm_step, run_workflow, tool_def


def _by_name(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def _parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def _register_lookup(harness: Harness) -> None:
    async def lookup(input: dict[str, Any]) -> dict[str, str]:
        await asyncio.sleep(0.1)  # long enough for parallel calls to overlap
        return {"city": input["city"], "weather": "sunny"}

    harness.tools.register("lookup", lookup)


def _two_rounds(fake: FakeLLMServer) -> dict[str, Any]:
    fake.openai.enqueue(
        openai_tool_calls(
            [("call_a", "lookup", '{"city": "Paris"}'), ("call_b", "lookup", '{"city": "Rome"}')]
        ),
        openai_text("Sunny in both."),
    )
    return llm_step(
        tools=[tool_def("lookup", {"city": {"type": "string"}}, ["city"])], parallelToolCalls=True
    )


async def test_a_two_round_run_with_parallel_tool_calls_is_one_genai_span_tree(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders, spans: InMemorySpanExporter
) -> None:
    _register_lookup(harness)
    result = await run_workflow(harness, workspace_id, _two_rounds(fake))
    assert result.status == "COMPLETED", result.run["error"]
    finished = spans.get_finished_spans()

    [root] = _by_name(finished, "create_run")
    [run] = _by_name(finished, "run loop-test")
    [step] = _by_name(finished, "step agent")
    chats = _by_name(finished, "chat gpt-4o-mini")
    tools = _by_name(finished, "execute_tool lookup")
    assert len(chats) == 2 and len(tools) == 2
    assert {s.context.trace_id for s in finished} == {root.context.trace_id}, "one trace per run"
    assert root.parent is None
    assert _parent_id(run) == root.context.span_id
    assert _parent_id(step) == run.context.span_id
    assert {_parent_id(s) for s in [*chats, *tools]} == {step.context.span_id}
    # The API stored the root's W3C context on the run; the worker continued it.
    stored = result.run["trace_context"]
    assert stored["traceparent"].split("-")[1] == format(root.context.trace_id, "032x")

    ids = {"stevora.workflow_run.id": result.id}
    assert dict(root.attributes or {}).items() >= ids.items()
    assert dict(run.attributes or {}).items() >= ids.items()
    assert step.attributes is not None
    assert step.attributes["stevora.step_run.id"] == result.step_runs[0]["id"]
    assert step.attributes["stevora.step.type"] == "llm"

    calls = sorted(result.llm_calls, key=lambda c: c["round"])
    for chat, row in zip(sorted(chats, key=lambda s: s.start_time or 0), calls, strict=True):
        attributes = dict(chat.attributes or {})
        assert attributes["gen_ai.operation.name"] == "chat"
        assert attributes["gen_ai.provider.name"] == "openai"
        assert attributes["gen_ai.request.model"] == "gpt-4o-mini"
        assert attributes["gen_ai.response.model"] == row["response"]["responseModel"]
        assert attributes["gen_ai.usage.input_tokens"] == row["input_tokens"]
        assert attributes["gen_ai.usage.output_tokens"] == row["output_tokens"]
        assert attributes["gen_ai.response.finish_reasons"] == (row["finish_reason"],)
        assert "gen_ai.input.messages" not in attributes, "content is opt-in"
    assert sorted((s.attributes or {})["gen_ai.tool.call.id"] for s in tools) == ["call_a", "call_b"]
    for tool in tools:
        attributes = dict(tool.attributes or {})
        assert attributes["gen_ai.operation.name"] == "execute_tool"
        assert attributes["gen_ai.tool.name"] == "lookup"
        assert "gen_ai.tool.call.arguments" not in attributes
    # The two calls ran at the same time: each started before the other ended.
    first, second = sorted(tools, key=lambda s: s.start_time or 0)
    assert (second.start_time or 0) < (first.end_time or 0)
    # Round 2's model call comes after both tool calls.
    assert (sorted(chats, key=lambda s: s.start_time or 0)[1].start_time or 0) >= max(
        t.end_time or 0 for t in tools
    )


async def test_message_contents_are_on_spans_only_when_opted_in(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders, spans: InMemorySpanExporter
) -> None:
    _register_lookup(harness)
    assert tracing._state.provider is not None
    tracing.use_provider(tracing._state.provider, capture_content=True)
    result = await run_workflow(harness, workspace_id, _two_rounds(fake), {"question": "Weather?"})
    assert result.status == "COMPLETED", result.run["error"]
    finished = spans.get_finished_spans()
    chat = _by_name(finished, "chat gpt-4o-mini")[-1]
    assert "Weather?" in str((chat.attributes or {})["gen_ai.input.messages"])
    assert "Sunny in both." in str((chat.attributes or {})["gen_ai.output.messages"])
    tool = _by_name(finished, "execute_tool lookup")[0]
    assert "sunny" in str((tool.attributes or {})["gen_ai.tool.call.result"])


async def test_a_run_resumed_after_a_wait_continues_its_trace(
    harness: Harness, workspace_id: str, spans: InMemorySpanExporter
) -> None:
    steps: list[dict[str, Any]] = [
        {"type": "wait", "name": "pause", "durationMs": 200},
        {"type": "wait", "name": "after", "durationMs": 0},
    ]
    result = await run_workflow(harness, workspace_id, steps)
    assert result.status == "COMPLETED", result.run["error"]
    finished = spans.get_finished_spans()
    executions = _by_name(finished, "run loop-test")
    assert len(executions) >= 2, [s.name for s in finished]
    [root] = _by_name(finished, "create_run")
    assert {s.context.trace_id for s in finished} == {root.context.trace_id}
    assert {_parent_id(s) for s in executions} == {root.context.span_id}


async def test_runs_carry_no_trace_context_when_tracing_is_off(harness: Harness, workspace_id: str) -> None:
    result = await run_workflow(harness, workspace_id, {"type": "wait", "name": "pause", "durationMs": 0})
    assert result.status == "COMPLETED", result.run["error"]
    assert result.run["trace_context"] is None


async def test_a_forks_trace_is_linked_to_its_origins(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders, spans: InMemorySpanExporter
) -> None:
    from stevora.engine import fork as forking

    _register_lookup(harness)
    origin = await run_workflow(harness, workspace_id, _two_rounds(fake))
    assert origin.status == "COMPLETED", origin.run["error"]
    [origin_root] = _by_name(spans.get_finished_spans(), "create_run")
    spans.clear()
    fake.openai.enqueue(openai_text("Forked."))
    plan = await forking.plan_fork(harness.rt, workspace_id, origin.id, "agent:2", {})
    fork, created = await forking.create_fork(harness.rt, plan, origin.run["definition_id"], None)
    assert created
    await harness.wait_for_status(fork["id"], "COMPLETED")
    finished = spans.get_finished_spans()
    [root] = _by_name(finished, "fork_run")
    [run] = _by_name(finished, "run loop-test")
    # The fork is its own trace (rooted at fork_run), every span of it in that trace...
    assert {s.context.trace_id for s in finished} == {root.context.trace_id}
    assert root.context.trace_id != origin_root.context.trace_id
    assert _parent_id(run) == root.context.span_id
    # ...and its root and each of its run spans link to the origin's root span.
    for span in (root, run):
        [link] = span.links
        assert (link.context.trace_id, link.context.span_id) == (
            origin_root.context.trace_id,
            origin_root.context.span_id,
        )
        assert dict(link.attributes or {}) == {"stevora.link": "forked_from"}
    assert dict(root.attributes or {})["stevora.workflow_run.id"] == fork["id"]
