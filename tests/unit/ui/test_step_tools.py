"""The run page's tool panel lists what the step offered: its own tools, workflow tools, and the
worker's global tools that only the model call's request names."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from stevora.tools import ToolRegistry
from stevora.ui.queries import step_tools


def test_the_panel_adds_global_tools_the_model_was_offered_and_labels_workflow_tools() -> None:
    registry = ToolRegistry()
    registry.register("clock", lambda input: "12:00", description="The time", global_=True)
    registry.register("lookup", lambda input: "x", description="Look it up")
    steps: list[Any] = [
        {"name": "agent", "type": "llm", "tools": ["lookup", {"name": "research", "workflow": "web-search"}]}
    ]
    views = step_tools(SimpleNamespace(tools=registry), steps, "agent", ["lookup", "research", "clock"])  # type: ignore[arg-type]
    assert [(v.name, v.source) for v in views] == [
        ("lookup", "registered"),
        ("research", "workflow"),
        ("clock", "registered"),
    ]
    assert views[2].description == "The time"
    assert "web-search" in (views[1].description or "")
