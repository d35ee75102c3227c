"""Images and files through the real SDKs against the fakes (docs/providers.md, "Images and files"):
input images reach both providers in their formats, a tool's image reaches Anthropic inside its
tool_result and OpenAI in a user message after the tool results, and the bytes are stored once."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

import pytest

from stevora import Image
from stevora.engine import commands
from stevora.engine.steps.awaited import client as tool_outputs
from stevora.errors import PayloadTooLarge
from stevora.testing.fake_llm import (
    FakeLLMServer,
    anthropic_text,
    anthropic_tool_use,
    openai_text,
    openai_tool_calls,
)
from tests.conftest import Harness, create_definition
from tests.integration.loop.conftest import (
    SdkProviders,
    anthropic_messages,
    llm_step,
    openai_messages,
    run_workflow,
    tool_def,
)
from tests.integration.loop.test_loop_basics import assert_trace_event_consistency

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
PDF = b"%PDF-1.7\n" + b"0" * 500
SHOT_STEP = {
    "messages": [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is on this screen?"},
                {"type": "image", "mediaType": "image/png", "data": "{{input.screenshot}}"},
            ],
        }
    ]
}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def blob_rows(harness: Harness, workspace_id: str) -> list[Any]:
    """The workspace's stored images and files (with the bytes' own length, to show they are all there)."""
    return list(
        await harness.rt.pool.fetch(
            "SELECT sha256, media_type, size_bytes, octet_length(data) AS n FROM blobs WHERE workspace_id = $1",
            workspace_id,
        )
    )


async def test_an_input_image_reaches_chat_completions_as_a_data_url_part(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    fake.openai.enqueue(openai_text("A login form."))
    result = await run_workflow(harness, workspace_id, llm_step(**SHOT_STEP), {"screenshot": b64(PNG)})

    assert result.status == "COMPLETED", result.run["error"]
    (user,) = openai_messages(fake, 0)
    assert user["content"] == [
        {"type": "text", "text": "What is on this screen?"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64(PNG)}"}},
    ]
    # The checkpoint names the image by hash; the bytes are in `blobs`, once.
    stored = result.llm_calls[0]["request"]["messages"][0]["parts"][1]
    assert stored == {"type": "image", "mediaType": "image/png", "sha256": hashlib.sha256(PNG).hexdigest()}
    assert [(r["media_type"], r["n"]) for r in await blob_rows(harness, workspace_id)] == [
        ("image/png", len(PNG))
    ]


async def test_an_input_image_and_pdf_reach_anthropic_as_image_and_document_blocks(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    fake.anthropic.enqueue(anthropic_text("Read both."))
    step = llm_step(
        model="claude-haiku-4-5",
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "image", "mediaType": "image/png", "data": "{{input.screenshot}}"},
                    {"type": "file", "mediaType": "application/pdf", "data": "{{input.contract}}"},
                    {"type": "text", "text": "Compare them."},
                ],
            }
        ],
    )
    result = await run_workflow(harness, workspace_id, step, {"screenshot": b64(PNG), "contract": b64(PDF)})

    assert result.status == "COMPLETED", result.run["error"]
    (user,) = anthropic_messages(fake, 0)
    assert user["content"] == [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)}},
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": b64(PDF)}},
        {"type": "text", "text": "Compare them."},
    ]


async def test_a_tool_returning_an_image_reaches_anthropic_inside_its_tool_result(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    async def screenshot(input: dict[str, Any]) -> list[Any]:
        return ["Here is the page.", Image(PNG, media_type="image/png")]

    harness.tools.register("screenshot", screenshot)
    fake.anthropic.enqueue(
        anthropic_tool_use([("toolu_1", "screenshot", {"url": "https://example.test"})]),
        anthropic_text("It shows a form."),
    )
    step = llm_step(
        model="claude-haiku-4-5", tools=[tool_def("screenshot", {"url": {"type": "string"}}, ["url"])]
    )
    result = await run_workflow(harness, workspace_id, step)

    assert result.status == "COMPLETED", result.run["error"]
    digest = hashlib.sha256(PNG).hexdigest()
    block = {"type": "image", "mediaType": "image/png", "bytes": len(PNG), "sha256": digest}
    (trace,) = result.traces
    assert trace["output_json"] == ["Here is the page.", block]  # the trace names the image by hash
    _, _, results = anthropic_messages(fake, 1)
    (tool_result,) = results["content"]
    assert tool_result["type"] == "tool_result" and tool_result["tool_use_id"] == "toolu_1"
    assert tool_result["content"] == [
        {"type": "text", "text": json.dumps(["Here is the page.", block], ensure_ascii=False)},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)}},
    ]
    await assert_trace_event_consistency(harness, result.id)


async def test_a_tool_image_reaches_chat_completions_in_a_user_message_after_the_tool_results(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    async def screenshot(input: dict[str, Any]) -> Image:
        return Image(PNG)

    async def title(input: dict[str, Any]) -> str:
        return "Login"

    harness.tools.register("screenshot", screenshot)
    harness.tools.register("title", title)
    fake.openai.enqueue(
        openai_tool_calls([("call_1", "screenshot", "{}"), ("call_2", "title", "{}")]),
        openai_text("A login page."),
    )
    result = await run_workflow(
        harness, workspace_id, llm_step(tools=[tool_def("screenshot"), tool_def("title")])
    )

    assert result.status == "COMPLETED", result.run["error"]
    messages = openai_messages(fake, 1)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "user"]
    assert isinstance(messages[2]["content"], str)  # tool messages take text only
    assert messages[4]["content"] == [
        {"type": "text", "text": "Attachments returned by tool call call_1:"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64(PNG)}"}},
    ]


async def test_a_one_megabyte_image_over_ten_rounds_is_stored_once_and_sent_every_round(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    big = b"\x89PNG\r\n\x1a\n" + hashlib.sha256(b"seed").digest() * (1024 * 1024 // 32)

    async def capture(input: dict[str, Any]) -> Any:
        # Round 1 returns the 1 MB screenshot; later rounds return it again (the same bytes).
        return Image(big) if input["n"] % 3 == 0 else {"ok": input["n"]}

    harness.tools.register("capture", capture)
    fake.anthropic.enqueue(
        *[anthropic_tool_use([(f"toolu_{n}", "capture", {"n": n})]) for n in range(10)],
        anthropic_text("done"),
    )
    step = llm_step(
        model="claude-haiku-4-5",
        tools=[tool_def("capture", {"n": {"type": "integer"}}, ["n"])],
        maxToolRounds=10,
    )
    result = await run_workflow(harness, workspace_id, step, timeout_s=60)

    assert result.status == "COMPLETED", result.run["error"]
    assert len(fake.anthropic.requests) == 11
    # Every request after the first round sends the image inside round 1's tool result.
    for request in fake.anthropic.requests[1:]:
        first_result = request.json["messages"][2]["content"][0]
        assert first_result["content"][1]["source"]["data"] == b64(big)
    rows = await blob_rows(harness, workspace_id)
    assert [(r["size_bytes"], r["n"]) for r in rows] == [
        (len(big), len(big))
    ]  # once, though returned 4 times
    # Checkpoint rows hold the hash only: every llm_calls and tool_trace row is small.
    calls = await harness.rt.pool.fetchval(
        "SELECT max(octet_length(request::text) + octet_length(coalesce(response::text, ''))) "
        "FROM llm_calls WHERE workflow_run_id = $1",
        result.id,
    )
    traces = await harness.rt.pool.fetch(
        "SELECT octet_length(output_json::text) AS n, output_json FROM tool_trace WHERE workflow_run_id = $1",
        result.id,
    )
    assert calls < 4_000 and len(traces) == 10 and max(t["n"] for t in traces) < 200
    digest = hashlib.sha256(big).hexdigest()
    assert sum(1 for t in traces if digest in str(t["output_json"])) == 4


async def test_templated_image_data_that_is_not_base64_fails_the_step_naming_the_field(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    # Not exactly `{{input.x}}`, so not checked when the run is created: the step checks it.
    part = {"type": "image", "mediaType": "image/png", "data": "iVBO{{input.rest}}"}
    step = llm_step(messages=[{"role": "user", "content": [part]}])
    result = await run_workflow(harness, workspace_id, step, {"rest": "Rw0K not base64!"})

    assert result.status == "FAILED"
    error = result.run["error"]
    assert error["code"] == "INVALID_ATTACHMENT"
    assert error["message"].startswith("messages[0].content[0].data: data is not valid base64")
    assert fake.openai.requests == [] and await blob_rows(harness, workspace_id) == []
    assert result.event_types().count("STEP_RETRYING") == 0  # the same data would fail again


async def test_a_step_resumed_in_a_new_execution_sends_the_same_image_read_back_from_blobs(
    harness: Harness, workspace_id: str, fake: FakeLLMServer, sdk: SdkProviders
) -> None:
    # A client tool makes the step wait: the execution ends, and the answer resumes the step in a
    # new one, which rebuilds the conversation from the rows (the image by hash) and reads the bytes.
    fake.openai.enqueue(openai_tool_calls([("call_1", "confirm", "{}")]), openai_text("Confirmed."))
    confirm = {**tool_def("confirm"), "execution": "client"}
    spec = {"name": "resume-image", "version": "1", "steps": [llm_step(**SHOT_STEP, tools=[confirm])]}
    def_id = await create_definition(harness.rt, workspace_id, spec)
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id, {"screenshot": b64(PNG)})
    await harness.wait_for_status(run["id"], "WAITING")
    await tool_outputs.submit_tool_outputs(
        harness.rt, workspace_id, run["id"], [tool_outputs.ToolOutput("call_1", output={"ok": True})]
    )
    done = await harness.wait_for_status(run["id"], "COMPLETED", "FAILED")

    assert done["status"] == "COMPLETED", done["error"]
    first, second = (r.json["messages"][0] for r in fake.openai.requests)
    assert first == second  # byte for byte the same prompt, image included, after the resume
    assert second["content"][1]["image_url"]["url"] == f"data:image/png;base64,{b64(PNG)}"


async def test_an_input_image_over_the_attachment_limit_is_refused_when_the_run_is_created(
    harness: Harness, workspace_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        harness.rt, "settings", harness.rt.settings.model_copy(update={"max_attachment_bytes": 100})
    )
    spec = {"name": "too-big", "version": "1", "steps": [llm_step(**SHOT_STEP)]}
    def_id = await create_definition(harness.rt, workspace_id, spec)
    with pytest.raises(PayloadTooLarge) as refused:
        await commands.create_run(harness.rt, workspace_id, def_id, {"screenshot": b64(PNG)})

    assert refused.value.http_status == 413
    assert refused.value.details["errors"][0]["path"] == "input.screenshot"
    assert refused.value.details["bytes"] == len(PNG) and refused.value.details["limitBytes"] == 100
    assert (
        await harness.rt.pool.fetchval(
            "SELECT count(*) FROM workflow_runs WHERE workspace_id = $1", workspace_id
        )
        == 0
    )
