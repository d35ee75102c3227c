"""The tool loop against the loopback fake of both provider APIs, through the real SDKs.

`fake` is one FakeLLMServer for the session, reset around every test. `sdk` registers an
OpenAIProvider ("openai") and an AnthropicProvider ("anthropic") on the harness router, each on
an SDK client built here with `_strict_response_validation=True`, so routing by model prefix
(`gpt-*`, `claude-*`) reaches the fake. `LoopRun` runs a one-step workflow end to end (
`create_definition` + `commands.create_run` + `wait_for_status`) and reads back its rows.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import asyncpg
import openai
import pytest

from stevora.engine import commands
from stevora.llm.anthropic_provider import AnthropicProvider
from stevora.llm.openai_provider import OpenAIProvider
from stevora.testing.fake_llm import FakeLLMServer
from stevora.testing.fake_prompt_cache import without_cache_markers
from tests.conftest import Harness, create_definition


@pytest.fixture(scope="session")
def fake_llm_session() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as server:
        yield server


@pytest.fixture
def fake(fake_llm_session: FakeLLMServer) -> Iterator[FakeLLMServer]:
    fake_llm_session.reset()
    yield fake_llm_session
    fake_llm_session.reset()


class SdkProviders:
    """Builds SDK-backed providers on the fake and closes their clients at teardown."""

    def __init__(self, harness: Harness, fake: FakeLLMServer) -> None:
        self.harness = harness
        self.fake = fake
        self._clients: list[openai.AsyncOpenAI | anthropic.AsyncAnthropic] = []

    def openai(
        self, *, max_retries: int = 0, name: str = "openai", timeout_s: float = 10.0
    ) -> OpenAIProvider:
        client = openai.AsyncOpenAI(
            api_key="test",
            base_url=self.fake.openai_base_url,
            max_retries=max_retries,
            timeout=timeout_s,
            _strict_response_validation=True,
        )
        self._clients.append(client)
        provider = OpenAIProvider("test", name=name, client=client)
        self.harness.rt.providers.register(name, provider)
        return provider

    def anthropic(
        self, *, max_retries: int = 0, name: str = "anthropic", timeout_s: float = 10.0
    ) -> AnthropicProvider:
        client = anthropic.AsyncAnthropic(
            api_key="test",
            base_url=self.fake.anthropic_base_url,
            max_retries=max_retries,
            timeout=timeout_s,
            open_telemetry=False,
            _strict_response_validation=True,
        )
        self._clients.append(client)
        provider = AnthropicProvider("test", name=name, client=client)
        self.harness.rt.providers.register(name, provider)
        return provider

    async def aclose(self) -> None:
        for client in self._clients:
            await client.close()


@pytest.fixture
async def sdk(harness: Harness, fake: FakeLLMServer) -> AsyncIterator[SdkProviders]:
    """Both providers registered with SDK retries off (tests that want retries re-register)."""
    providers = SdkProviders(harness, fake)
    providers.openai()
    providers.anthropic()
    try:
        yield providers
    finally:
        await providers.aclose()


@dataclass
class LoopRun:
    """A finished run of a one-step llm workflow and its rows."""

    harness: Harness
    run: asyncpg.Record
    llm_calls: list[asyncpg.Record]
    traces: list[asyncpg.Record]
    events: list[asyncpg.Record]
    step_runs: list[asyncpg.Record]

    @property
    def id(self) -> str:
        return str(self.run["id"])

    @property
    def status(self) -> str:
        return str(self.run["status"])

    @property
    def state(self) -> dict[str, Any]:
        return dict(self.run["state"] or {})

    def event_types(self) -> list[str]:
        return [e["event_type"] for e in self.events]

    def events_of(self, event_type: str) -> list[dict[str, Any]]:
        return [dict(e["payload"]) for e in self.events if e["event_type"] == event_type]

    def completed_calls(self) -> list[asyncpg.Record]:
        return [c for c in self.llm_calls if c["status"] == "completed"]


def llm_step(**fields: Any) -> dict[str, Any]:
    """An llm step definition with defaults for the required fields."""
    step: dict[str, Any] = {
        "type": "llm",
        "name": "agent",
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "{{input.question}}"}],
    }
    step.update(fields)
    return step


def tool_def(name: str, properties: dict[str, Any] | None = None, required: list[str] | None = None) -> dict:
    schema: dict[str, Any] = {"type": "object", "properties": properties or {}}
    if required:
        schema["required"] = required
    return {"name": name, "description": f"The {name} tool", "parameters": schema}


async def run_workflow(
    harness: Harness,
    workspace_id: str,
    steps: list[dict[str, Any]] | dict[str, Any],
    input: dict[str, Any] | None = None,
    *,
    timeout_s: float = 20.0,
) -> LoopRun:
    """Store a workflow of `steps` (one step dict or a list), run it, wait for the end."""
    spec = {"name": "loop-test", "version": "1", "steps": [steps] if isinstance(steps, dict) else steps}
    def_id = await create_definition(harness.rt, workspace_id, spec)
    run, _ = await commands.create_run(harness.rt, workspace_id, def_id, input or {"question": "Hello?"})
    row = await harness.wait_for_status(run["id"], "COMPLETED", "FAILED", timeout_s=timeout_s)
    return await load_run(harness, row["id"])


async def load_run(harness: Harness, run_id: str) -> LoopRun:
    pool = harness.rt.pool
    return LoopRun(
        harness=harness,
        run=await pool.fetchrow("SELECT * FROM workflow_runs WHERE id = $1", run_id),
        llm_calls=await pool.fetch(
            "SELECT * FROM llm_calls WHERE workflow_run_id = $1 ORDER BY created_at, round", run_id
        ),
        traces=await pool.fetch(
            "SELECT * FROM tool_trace WHERE workflow_run_id = $1 ORDER BY round, sequence", run_id
        ),
        events=await harness.events(run_id),
        step_runs=await pool.fetch(
            "SELECT * FROM step_runs WHERE workflow_run_id = $1 ORDER BY attempt", run_id
        ),
    )


def openai_messages(fake: FakeLLMServer, index: int) -> list[dict[str, Any]]:
    """The `messages` of the index-th request the OpenAI route received."""
    return list(fake.openai.requests[index].json["messages"])


def anthropic_messages(fake: FakeLLMServer, index: int) -> list[dict[str, Any]]:
    """The `messages` of the index-th Anthropic request, prompt-cache markers aside."""
    return list(without_cache_markers(fake.anthropic.requests[index].json)["messages"])


def anthropic_system(fake: FakeLLMServer, index: int) -> str | None:
    """The system prompt's text of the index-th Anthropic request (sent as one text block that
    carries a cache breakpoint, or as a string when the step turned caching off)."""
    system = fake.anthropic.requests[index].json.get("system")
    if isinstance(system, list):
        return "".join(block["text"] for block in system)
    return system


def error_json(message: str) -> str:
    """The exact tool-result text the model gets for a failed tool call."""
    return json.dumps({"error": message})
