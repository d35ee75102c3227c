"""examples/toolbox.py and examples/shopping-agent.json, as docs/tool-calling.md shows them."""

from __future__ import annotations

import json
from pathlib import Path

import examples.toolbox as example_toolbox
from stevora.client import AsyncAgentRuntime
from stevora.llm.scripted_provider import ScriptedProvider
from stevora.tools import register_toolbox
from tests.conftest import Harness

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


async def test_the_shopping_agent_keeps_one_list_per_run(client: AsyncAgentRuntime, harness: Harness) -> None:
    harness.rt.providers.register("openai", ScriptedProvider(name="openai"))  # offline, as `stevora dev`
    names = register_toolbox(example_toolbox.ShoppingList, registry=harness.tools)
    assert names == ["ShoppingList_add", "ShoppingList_remove", "ShoppingList_show"]
    definition = await client.definitions.apply(json.loads((EXAMPLES / "shopping-agent.json").read_text()))
    for _ in range(2):
        run = await client.workflows.create(definition.id, {"request": "Add oat milk"})
        done = await client.workflows.wait_for_completion(run.id, timeout=20, poll_interval=0.05)
        assert done.status == "COMPLETED", done.error
        traces = {t.tool_name: t for t in await client.workflows.tool_traces(run.id)}
        # The scripted agent calls the tools once, in parallel, but does not empty the list unasked.
        assert sorted(traces) == ["ShoppingList_add", "ShoppingList_show"]
        # One list per run: the second run starts empty, whatever the first one left.
        assert traces["ShoppingList_add"].output_json == ["oat milk"]
        state = done.state["toolbox:ShoppingList"]
        assert state == {"calls": 2, "attributes": {"items": ["oat milk"]}}
