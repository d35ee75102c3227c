"""Approval requests."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from stevora.api.schemas.envelope import ApiIn, ApiOut, Timestamp
from stevora.statuses import ApprovalStatus

Decision = Literal["approved", "rejected", "edited"]


class DecisionIn(ApiIn):
    # `edited` needs the content it approves instead (not null).
    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"properties": {"decision": {"enum": ["approved", "rejected"]}}},
                {"required": ["editedContent"], "properties": {"editedContent": {"not": {"type": "null"}}}},
            ]
        }
    )

    decision: Decision
    edited_content: Any = Field(default=None, description="Required when decision is 'edited'.")
    decided_by: str | None = Field(default=None, max_length=200)


class ApprovalOut(ApiOut):
    id: str = Field(examples=["apr_abc123"])
    workflow_run_id: str
    step_run_id: str
    step_name: str
    content_key: str
    content: Any
    prompt: str | None
    status: ApprovalStatus
    decision: Decision | None
    edited_content: Any
    decided_by: str | None
    decided_at: Timestamp | None
    expires_at: Timestamp | None
    awaited_tool_call_id: str | None = Field(
        default=None,
        description="Set when this request gates a tool call: `content` is `{tool, arguments, toolCallId}`; "
        "`approved` runs the call, `edited` runs it with `editedContent` as its arguments, `rejected` "
        "gives the model an error result.",
    )
    created_at: Timestamp
