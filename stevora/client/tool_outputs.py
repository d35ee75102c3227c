"""The items of `workflows.submit_tool_outputs`: a typed `ToolOutput`, or the API's own dicts."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final, Literal, TypeAlias


class _Unset(Enum):
    UNSET = "UNSET"


UNSET: Final = _Unset.UNSET
"""`output` not given (distinct from `None`, which sends a JSON `null` output)."""


@dataclass(frozen=True, slots=True)
class ToolOutput:
    """The answer to one client-executed tool call: its `output` (any JSON value), or `error`
    (a message the model receives as `{"error": message}`, recorded as a failed call)."""

    tool_call_id: str
    output: Any | Literal[_Unset.UNSET] = UNSET
    error: str | None = None

    def __post_init__(self) -> None:
        if (self.output is UNSET) == (self.error is None):
            raise ValueError(f"ToolOutput({self.tool_call_id!r}): give exactly one of output or error")

    def to_json(self) -> dict[str, Any]:
        if self.error is not None:
            return {"toolCallId": self.tool_call_id, "error": self.error}
        return {"toolCallId": self.tool_call_id, "output": self.output}


ToolOutputItem: TypeAlias = ToolOutput | Mapping[str, Any]
"""A `ToolOutput`, or a dict as the API takes it (`{"toolCallId", "output"}` or
`{"toolCallId", "error"}`; `tool_call_id` is accepted for `toolCallId`)."""


def tool_outputs_body(items: Iterable[ToolOutputItem]) -> dict[str, Any]:
    """The request body of `POST /v1/workflow-runs/{id}/tool-outputs`."""
    out: list[dict[str, Any]] = []
    for item in items:
        if isinstance(item, ToolOutput):
            out.append(item.to_json())
            continue
        entry = dict(item)
        if "tool_call_id" in entry and "toolCallId" not in entry:
            entry["toolCallId"] = entry.pop("tool_call_id")
        out.append(entry)
    return {"toolOutputs": out}
