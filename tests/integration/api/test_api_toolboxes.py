"""Toolboxes (issue 22, "simonw/llm users"): a class whose methods are tools sharing state, one
instance per run, its state kept in the run's state and written with each call's checkpoint."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from api_helpers import Tenant
from test_api_tool_outputs import start, wait_for
from test_api_workflow_tools import defined

from stevora.ids import new_id
from stevora.llm.messages import LlmResponse, ToolCall, Usage
from stevora.tools import Toolbox, ToolContext, ToolRegistry, register_toolbox
from tests.conftest import Harness


class Notes(Toolbox):
    """A shopping list."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, item: str) -> int:
        """Put an item on the list; returns how many there are.

        Args:
            item: What to buy.
        """
        self.items.append(item)
        return len(self.items)

    async def show(self) -> list[str]:
        """Everything on the list."""
        return list(self.items)

    def remove(self, item: str, context: ToolContext) -> bool:
        """Take an item off the list."""
        assert context.workflow_run_id  # a method may take the call's context too
        if item in self.items:
            self.items.remove(item)
            return True
        return False


def turn(*calls: tuple[str, dict[str, Any]]) -> LlmResponse:
    return LlmResponse(
        text=None if calls else "done",
        tool_calls=[ToolCall(new_id("call"), name, json.dumps(args)) for name, args in calls],
        usage=Usage(10, 5),
        model="scripted",
        finish_reason="tool_calls" if calls else "stop",
        response_id=None,
        provider="scripted",
    )


def agent(*tools: Any) -> dict[str, Any]:
    return {
        "name": new_id("shop"),
        "steps": [
            {
                "type": "llm",
                "name": "agent",
                "model": "scripted",
                "messages": [{"role": "user", "content": "Shop"}],
                "tools": list(tools),
            }
        ],
    }


async def outputs(client: httpx.AsyncClient, tenant: Tenant, run_id: str) -> list[tuple[str, Any]]:
    traces = (await client.get(f"/v1/workflow-runs/{run_id}/tool-traces", headers=tenant.headers)).json()[
        "data"
    ]
    return [(t["toolName"], t["outputJson"]) for t in traces]


def test_methods_become_tools_with_schemas_from_hints_and_docstrings() -> None:
    registry = ToolRegistry()
    assert register_toolbox(Notes, registry=registry) == ["Notes_add", "Notes_remove", "Notes_show"]
    add = registry.get("Notes_add")
    assert add is not None and add.description == "Put an item on the list; returns how many there are."
    assert add.parameters["properties"] == {"item": {"type": "string", "description": "What to buy."}}
    assert add.parameters["required"] == ["item"]
    remove = registry.get("Notes_remove")
    assert remove is not None and list(remove.parameters["properties"]) == ["item"]  # the context is not one
    assert register_toolbox(Notes, prefix="shop", registry=registry)[0] == "shop_add"

    class Needy:
        def __init__(self, path: str) -> None:
            self.path = path

        def read(self) -> str:
            return self.path

    with pytest.raises(TypeError, match="cannot require arguments"):
        register_toolbox(Needy, registry=registry)


async def test_each_run_has_its_own_instance_and_parallel_calls_share_it(
    client: httpx.AsyncClient, tenant: Tenant, harness: Harness
) -> None:
    """Fails where one shared instance lets run 2 list run 1's items."""
    register_toolbox(Notes, registry=harness.tools)
    harness.scripted.enqueue(
        turn(("Notes_add", {"item": "milk"}), ("Notes_add", {"item": "eggs"})),  # parallel, one round
        turn(("Notes_remove", {"item": "milk"}), ("Notes_show", {})),
        turn(),
    )
    first = await start(
        client, tenant, await defined(client, tenant, agent("Notes"))
    )  # the prefix: all tools
    done = await wait_for(client, tenant, first, "COMPLETED", "FAILED")
    assert done["status"] == "COMPLETED", done["error"]
    assert await outputs(client, tenant, first) == [
        ("Notes_add", 1),
        ("Notes_add", 2),
        ("Notes_remove", True),
        ("Notes_show", ["eggs"]),
    ]
    assert done["state"]["toolbox:Notes"] == {"calls": 4, "attributes": {"items": ["eggs"]}}

    harness.scripted.enqueue(turn(("Notes_show", {})), turn())
    second = await start(client, tenant, await defined(client, tenant, agent("Notes_show")))
    assert (await wait_for(client, tenant, second, "COMPLETED", "FAILED"))["status"] == "COMPLETED"
    assert await outputs(client, tenant, second) == [("Notes_show", [])]


async def test_a_failed_call_leaves_the_state_as_it_was(
    client: httpx.AsyncClient, tenant: Tenant, harness: Harness
) -> None:
    class Counter(Toolbox):
        def __init__(self) -> None:
            self.n = 0

        def bump(self, fail: bool = False) -> int:
            """Count; fail after counting when asked."""
            self.n += 1
            if fail:
                raise RuntimeError("no")
            return self.n

    register_toolbox(Counter, registry=harness.tools)
    harness.scripted.enqueue(
        turn(("Counter_bump", {})), turn(("Counter_bump", {"fail": True})), turn(("Counter_bump", {})), turn()
    )
    run_id = await start(client, tenant, await defined(client, tenant, agent("Counter")))
    done = await wait_for(client, tenant, run_id, "COMPLETED", "FAILED")
    assert [o for _, o in await outputs(client, tenant, run_id)] == [1, None, 2]
    assert done["state"]["toolbox:Counter"]["attributes"] == {"n": 2}
