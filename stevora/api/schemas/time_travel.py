"""Request bodies of time travel: fork, replay, bulk replay and bulk retry (docs/time-travel.md).

The published schema is what the server takes: known fields only (`extra="forbid"`), strict
types (`true` is not a round number). What depends on the run (is there a fork point, is the model
configured) is checked by the engine, 400 naming the field."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StringConstraints,
    WithJsonSchema,
)

from stevora.api.schemas.envelope import ApiIn
from stevora.engine.bulk import MAX_RUNS

Name = Annotated[str, StringConstraints(min_length=1, max_length=200)]
RunIdText = Annotated[str, StringConstraints(min_length=1, max_length=100)]
IdempotencyKey = Annotated[str, StringConstraints(min_length=1, max_length=255)]
# Checked by the engine (an empty one is "must be a version of the run's definition").
Version = Annotated[str, StringConstraints(max_length=200)]
Positive = Annotated[StrictInt, Field(ge=1, le=2**31 - 1)]


class ForkAt(ApiIn):
    step: Name
    round: Positive | None = Field(
        default=None, description="A round of an llm step (1 = its first model call)."
    )
    visit: Positive | None = Field(default=None, description="Which visit of the step (default: the first).")


class ForkEdits(ApiIn):
    state: dict[str, Any] | None = Field(
        default=None, description="Top-level state keys set at the fork point (merged over its state)."
    )
    tool_results: dict[str, Any] | None = Field(
        default=None, description="Tool call id of the previous round → the result the fork's model reads."
    )
    model: Name | None = None
    system_prompt: str | None = None
    definition_version: Version | None = None


class ForkIn(ApiIn):
    at: ForkAt | Annotated[str, StringConstraints(min_length=1, max_length=200)] = Field(
        description="`{step, round?, visit?}` or `STEP` / `STEP:ROUND` (GET .../checkpoints lists the points)."
    )
    edits: ForkEdits | None = None
    idempotency_key: IdempotencyKey | None = Field(
        default=None, description="As the `Idempotency-Key` header (the header wins)."
    )


class ReplayIn(ApiIn):
    tools: Literal["recorded"] = "recorded"
    model: Name | None = None
    system_prompt: str | None = None
    step: Name | None = Field(default=None, description="The llm step `model` / `systemPrompt` apply to.")
    definition_version: Version | None = None
    unmatched: Literal["error", "live"] = "error"
    idempotency_key: IdempotencyKey | None = None


# Exactly one of `definition` and `runIds` (published, and checked by the route to name the field).
_ONE_SELECTION: dict[str, Any] = {
    "oneOf": [{"required": ["definition"]}, {"required": ["runIds"]}],
}
RunIds = Annotated[list[RunIdText], Field(min_length=1, max_length=MAX_RUNS)]


def _given(value: Any) -> Any:
    if value is None:
        raise ValueError("may be left out, not null")
    return value


# Fields that may be left out but not sent as null (`null` would be "left out" to the route and
# "given" to the published oneOf); the schema says so: no `null` in it.
OmittableName = Annotated[
    Name | None, BeforeValidator(_given), WithJsonSchema({"type": "string", "minLength": 1, "maxLength": 200})
]
OmittableRunIds = Annotated[
    RunIds | None,
    BeforeValidator(_given),
    WithJsonSchema(
        {
            "type": "array",
            "items": {"type": "string", "minLength": 1, "maxLength": 100},
            "minItems": 1,
            "maxItems": MAX_RUNS,
        }
    ),
]
OmittableCount = Annotated[
    Annotated[StrictInt, Field(ge=1, le=MAX_RUNS)] | None,
    BeforeValidator(_given),
    WithJsonSchema({"type": "integer", "minimum": 1, "maximum": MAX_RUNS}),
]


class BulkReplayIn(ReplayIn):
    model_config = ConfigDict(json_schema_extra=_ONE_SELECTION)

    definition: OmittableName = Field(default=None, description="Replay the last `last` ended runs of it.")
    run_ids: OmittableRunIds = None
    last: OmittableCount = Field(
        default=None, description="With `definition`: how many of its last ended runs (default 10)."
    )


class BulkRetryIn(ApiIn):
    model_config = ConfigDict(json_schema_extra=_ONE_SELECTION)

    definition: OmittableName = None
    run_ids: OmittableRunIds = None
    since: str | None = Field(default=None, description="ISO 8601 date or date-time (failed at or after).")
    until: str | None = Field(default=None, description="ISO 8601 date or date-time (failed before).")
    dry_run: StrictBool = False
