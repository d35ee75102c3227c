"""Workflow definitions (the request body is `stevora.definitions.WorkflowDefinitionSpec`)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from stevora.api.schemas.envelope import ApiOut, Timestamp


class DefinitionOut(ApiOut):
    id: str = Field(examples=["wfdef_abc123"])
    workspace_id: str
    name: str
    version: str
    description: str | None
    steps: list[dict[str, Any]]
    input_schema: dict[str, Any] | None = None
    default_params: str | None = None
    budget: dict[str, Any] | None = Field(default=None, description="The default budget of its runs.")
    concurrency: dict[str, Any] | None = Field(
        default=None, description="The concurrency key and limit of its runs (docs/flow-control.md)."
    )
    priority: int | None = Field(default=None, description="The default priority of its runs.")
    schedule: dict[str, Any] | None = Field(default=None, description="Its schedule (docs/triggers.md).")
    triggers: list[dict[str, Any]] | None = Field(default=None, description="Events that start its runs.")
    created_at: Timestamp
    updated_at: Timestamp
