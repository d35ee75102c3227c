"""`stevora prompt`: an ad-hoc one-step agent through the engine, against the fake OpenAI server
through the real SDK; each tool call and result printed live, then the answer, the run stored."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from conftest import Cli

from stevora.cli.prompt import PROMPT_DEFINITION, prompt_definition
from stevora.llm.openai_provider import OpenAIProvider
from stevora.testing.fake_llm import FakeLLMServer, openai_text, openai_tool_calls
from tests.conftest import Harness


@pytest.fixture
def fake_openai(harness: Harness) -> Any:
    with FakeLLMServer() as server:
        client = openai.AsyncOpenAI(api_key="test", base_url=server.openai_base_url, max_retries=0)
        harness.rt.providers.register("openai", OpenAIProvider("test", client=client))
        yield server


async def test_prompt_runs_a_tool_through_the_engine_and_prints_the_call_its_result_and_the_answer(
    cli: Cli, harness: Harness, fake_openai: FakeLLMServer
) -> None:
    async def refund_policy(input: dict[str, Any]) -> dict[str, Any]:
        return {"days": 30, "plan": input["plan"]}

    harness.tools.register(
        "refund_policy",
        refund_policy,
        description="The refund policy of a plan",
        parameters={"type": "object", "properties": {"plan": {"type": "string"}}, "required": ["plan"]},
    )
    fake_openai.openai.enqueue(
        openai_tool_calls([("call_1", "refund_policy", '{"plan": "pro"}')]),
        openai_text("Pro plans can be refunded within 30 days."),
    )
    result = await cli(
        "prompt", "What is our refund policy?", "--model", "gpt-4o", "--tool", "refund_policy",
        "--system", "Answer briefly.", "--max-tool-rounds", "3",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    out = result.output
    assert 'refund_policy({"plan":"pro"})' in out.replace(" ", "")
    assert '"days": 30' in out or '"days":30' in out.replace(" ", "")
    assert out.rstrip().endswith("Pro plans can be refunded within 30 days.")
    # What the model was sent: the system prompt, the question, the tool; then the tool's result.
    first, second = (r.json for r in fake_openai.openai.requests)
    assert first["messages"][0] == {"role": "system", "content": "Answer briefly."}
    assert first["messages"][1]["content"] == "What is our refund policy?"
    assert [t["function"]["name"] for t in first["tools"]] == ["refund_policy"]
    assert second["messages"][-1]["role"] == "tool"
    # The run is stored like any other, under the prompt definition.
    run = await harness.rt.pool.fetchrow(
        "SELECT r.id, r.status FROM workflow_runs r JOIN workflow_definitions d ON d.id = r.definition_id "
        "WHERE d.name = $1 ORDER BY r.created_at DESC LIMIT 1",
        PROMPT_DEFINITION,
    )
    assert run["status"] == "COMPLETED" and run["id"] in out
    assert (
        await harness.rt.pool.fetchval(
            "SELECT count(*) FROM tool_trace WHERE workflow_run_id = $1", run["id"]
        )
        == 1
    )


async def test_the_same_settings_reuse_one_definition_and_a_failed_run_exits_1(
    cli: Cli, harness: Harness, fake_openai: FakeLLMServer, workspace_id: str
) -> None:
    assert prompt_definition("gpt-4o", [], 10, None) == prompt_definition("gpt-4o", [], 10, None)
    assert (
        prompt_definition("gpt-4o", [], 10, None)["version"]
        != prompt_definition("gpt-4o", [], 9, None)["version"]
    )
    fake_openai.openai.enqueue(openai_text("hello"), openai_text("hello again"))
    assert (await cli("prompt", "hi")).exit_code == 0
    assert (await cli("prompt", "hi again")).exit_code == 0
    versions = await harness.rt.pool.fetchval(
        "SELECT count(*) FROM workflow_definitions WHERE name = $1 AND workspace_id = $2",
        PROMPT_DEFINITION,
        workspace_id,
    )
    assert versions == 1
    failed = await cli("prompt", "hi", "--tool", "not_registered_anywhere")
    assert failed.exit_code == 1 and "TOOL_NOT_REGISTERED" in failed.output
