"""Step models for the non-LLM step types (docs/definitions.md).

The `llm` step has its own module because it is as large as the other five together.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from pydantic import AwareDatetime, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from stevora.definitions.retry import (
    APPROVAL_RETRY_POLICY,
    DEFAULT_RETRY_POLICY,
    CamelModel,
    RetryPolicy,
    merge_retry_input,
)
from stevora.definitions.triggers import check_expression


def find_duplicates(names: Sequence[object]) -> list[tuple[int, str, int]]:
    """`(index, name, first_index)` for every string name already used earlier in `names`.

    Shared by the model validators and by `parse_definition`'s checks on raw input, so both
    report a duplicate the same way. Non-string entries are skipped (they are field errors).
    """
    first_index: dict[str, int] = {}
    duplicates: list[tuple[int, str, int]] = []
    for index, name in enumerate(names):
        if not isinstance(name, str):
            continue
        if name in first_index:
            duplicates.append((index, name, first_index[name]))
        else:
            first_index[name] = index
    return duplicates


class StepBase(CamelModel):
    """Fields every step type has: a workflow-unique `name` and an optional `retry`."""

    default_retry: ClassVar[RetryPolicy] = DEFAULT_RETRY_POLICY
    """What `retry` fields that a definition omits default to for this step type."""

    # Declared here (and narrowed to a Literal by each step type) only so that `type` comes
    # first in dumped JSON, which makes stored definitions easier to read.
    type: str
    name: str = Field(min_length=1, max_length=100)
    retry: RetryPolicy | None = None

    @field_validator("retry", mode="before")
    @classmethod
    def _fill_retry_defaults(cls, value: Any) -> Any:
        if value is None:
            return None
        return merge_retry_input(cls.default_retry, value)

    def effective_retry(self) -> RetryPolicy:
        """The policy the engine applies: the step's own, or its type's default."""
        return self.retry if self.retry is not None else self.default_retry


class TaskStep(StepBase):
    """Runs a handler registered in the worker under `handler`, passing it `config`."""

    type: Literal["task"] = "task"
    handler: str = Field(min_length=1)
    config: dict[str, Any] = Field(default_factory=dict)
    # One attempt's limit (unset: DEFAULT_TASK_TIMEOUT_MS); past it the attempt fails with TIMEOUT
    # and the RetryPolicy decides. Unset stays unset in stored definitions.
    timeout_ms: int | None = Field(default=None, ge=1, le=86_400_000)


class WaitStep(StepBase):
    """Pauses the run for `duration_ms` or until `until_timestamp`; exactly one is given."""

    type: Literal["wait"] = "wait"
    duration_ms: int | None = Field(default=None, ge=0)
    # Naive timestamps are rejected: "10:00" means different instants on different workers.
    until_timestamp: AwareDatetime | None = None

    @model_validator(mode="after")
    def _exactly_one_target(self) -> WaitStep:
        given = (self.duration_ms is not None) + (self.until_timestamp is not None)
        if given != 1:
            raise PydanticCustomError(
                "wait_target",
                "Wait step '{name}' needs exactly one of durationMs or untilTimestamp (got {got})",
                {"name": self.name, "got": "neither" if given == 0 else "both"},
            )
        return self


class ConditionStep(StepBase):
    """Jumps to `true_step` or `false_step` depending on a dot path into the run state."""

    type: Literal["condition"] = "condition"
    expression: str = Field(min_length=1)
    true_step: str
    false_step: str


EVENT_SIGNAL_PREFIX = "event:"


class ExternalEventStep(StepBase):
    """Waits for a `resume` call carrying `signal_type`, or for an event named `event` (posted to
    /v1/events after the step started) whose `match` CEL condition holds against the run
    (docs/triggers.md); fails after `timeout_ms` if set."""

    type: Literal["external_event"] = "external_event"
    signal_type: str | None = Field(default=None, min_length=1, max_length=100)
    event: str | None = Field(default=None, min_length=1, max_length=94)
    match: str | None = Field(default=None, min_length=1, max_length=4000)
    """CEL over the event (`name`, `data`, `id`, `ts`) and the run (`input`, `state`)."""
    timeout_ms: int | None = Field(default=None, ge=1)

    _match = field_validator("match")(lambda cls, v: check_expression(v) if v is not None else None)

    @model_validator(mode="after")
    def _one_source(self) -> ExternalEventStep:
        if (self.signal_type is None) == (self.event is None):
            raise ValueError("give exactly one of signalType and event")
        if self.match is not None and self.event is None:
            raise ValueError("match goes with event")
        return self

    def awaited_signal(self) -> str:
        """What the waiting step run records as its `signal_type` (an event wait: `event:<name>`)."""
        return self.signal_type if self.signal_type is not None else EVENT_SIGNAL_PREFIX + str(self.event)


class ToolStep(StepBase):
    """Runs one registered tool, no model: `input` values are templated (`{{input.x}}`,
    `{{state.x}}`, `{{steps.<name>.output.x}}`; a value that is exactly one template keeps its JSON
    type) and the result goes to `state[outputKey]` (default: the step name)."""

    type: Literal["tool"] = "tool"
    tool: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    input: dict[str, Any] = Field(default_factory=dict)
    output_key: str | None = Field(default=None, min_length=1)

    def effective_output_key(self) -> str:
        return self.output_key if self.output_key is not None else self.name


class ApprovalStep(StepBase):
    """Asks a human to approve, edit or reject the state value under `content_key`."""

    default_retry: ClassVar[RetryPolicy] = APPROVAL_RETRY_POLICY

    type: Literal["approval"] = "approval"
    content_key: str = Field(min_length=1)
    prompt: str | None = Field(default=None, max_length=4000)
    timeout_ms: int | None = Field(default=None, ge=1)


MAP_RETRY_POLICY = DEFAULT_RETRY_POLICY.model_copy(update={"max_attempts": 1})
"""Map steps are not retried automatically (a retry re-runs the failed items) unless asked."""


class MapStep(StepBase):
    """Runs the workflow `workflow` once per element of `items` as child runs, at most
    `concurrency` at a time, and puts their outputs, in item order, in `state[outputKey]`
    (default: the step name). `input` is templated per item: `{{item}}`, `{{item.x}}` and
    `{{index}}` besides `{{input.x}}` / `{{state.x}}`."""

    default_retry: ClassVar[RetryPolicy] = MAP_RETRY_POLICY

    type: Literal["map"] = "map"
    # A template naming a list (`{{input.tickets}}`), or a literal list.
    items: str | list[Any]
    workflow: str = Field(min_length=1, max_length=200)
    version: str | None = Field(default=None, min_length=1)
    input: dict[str, Any] = Field(default_factory=lambda: {"item": "{{item}}"})
    concurrency: int = Field(default=8, ge=1, le=1000)
    on_item_failure: Literal["fail", "continue"] = "fail"
    output_key: str | None = Field(default=None, min_length=1)

    @field_validator("items")
    @classmethod
    def _items_is_a_template(cls, value: str | list[Any]) -> str | list[Any]:
        if isinstance(value, str) and not re.fullmatch(r"\{\{\s*[A-Za-z0-9_$.\-]+\s*\}\}", value):
            raise PydanticCustomError(
                "map_items", "items must be one template naming a list (e.g. '{{input.tickets}}') or a list"
            )
        return value

    def effective_output_key(self) -> str:
        return self.output_key if self.output_key is not None else self.name
