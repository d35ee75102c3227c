"""A whole workflow definition, its cross-step rules, and `parse_definition` (docs/definitions.md).

`parse_definition` is the one entry point for untrusted definitions: it turns pydantic's
errors into Stevora's `ValidationError` with JS-like camelCase paths (`steps[1].tools[0].name`)
so API clients can point at the offending field.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, NamedTuple, get_args

from pydantic import AfterValidator, Field, model_validator
from pydantic import ValidationError as PydanticValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

from stevora.definitions.budget import Budget
from stevora.definitions.flow import MAX_PRIORITY, Concurrency, key_paths, schema_lacks
from stevora.definitions.llm_messages import FilePart, ImagePart, LlmMessage, TextPart
from stevora.definitions.llm_step import (
    DUPLICATE_TOOL_MESSAGE,
    INLINE_TOOL_TAG,
    MCP_TOOL_TAG,
    TOOL_REF_TAG,
    WORKFLOW_TOOL_TAG,
    GuardrailCheck,
    GuardrailConfig,
    LlmStep,
    LlmToolDef,
    McpToolsDef,
    ToolRef,
    WorkflowToolDef,
    _check_parameters_schema,
)
from stevora.definitions.params import ParamsError, parse_default_params
from stevora.definitions.retry import CamelModel, RetryPolicy
from stevora.definitions.steps import (
    ApprovalStep,
    ConditionStep,
    ExternalEventStep,
    MapStep,
    TaskStep,
    ToolStep,
    WaitStep,
    find_duplicates,
)
from stevora.definitions.triggers import EventTrigger, ScheduleTiming
from stevora.errors import ValidationError

StepDefinition = Annotated[
    TaskStep | WaitStep | ConditionStep | ExternalEventStep | LlmStep | ApprovalStep | ToolStep | MapStep,
    Field(discriminator="type"),
]
# The `type` of every step model in the union, in its order: a new step type is added to the union
# only (the engine's registry, stevora/engine/steps/registry.py, is checked against this).
STEP_TYPES: tuple[str, ...] = tuple(
    model.model_fields["type"].default for model in get_args(get_args(StepDefinition)[0])
)


def _check_default_params(text: str) -> str:
    try:
        parse_default_params(text)
    except ParamsError as exc:
        raise PydanticCustomError(
            "default_params", "Invalid defaultParams: {reason}", {"reason": str(exc)}
        ) from exc
    return text


_DUPLICATE_STEP = "duplicate_step_name"
_UNKNOWN_TARGET = "unknown_step_target"
_SELF_TARGET = "condition_targets_itself"


class WorkflowDefinitionSpec(CamelModel):
    """The body of a workflow definition: an ordered list of uniquely named steps."""

    name: str = Field(min_length=1, max_length=200)
    version: str = Field(min_length=1, max_length=50)
    description: str | None = Field(default=None, max_length=1000)
    steps: list[StepDefinition] = Field(min_length=1)
    input_schema: Annotated[dict[str, Any], AfterValidator(_check_parameters_schema)] | None = None
    """JSON Schema (type object) of the run input: checked when a run is created, and the
    parameters the model sees when another workflow calls this one as a tool."""
    default_params: Annotated[str, AfterValidator(_check_default_params)] | None = Field(
        default=None, max_length=2000
    )
    """Dagu-style `"query max_results=10"`: an input schema written as a parameter list."""
    budget: Budget | None = None
    """The default budget of this workflow's runs (a run's create request may override it)."""
    concurrency: Concurrency | None = None
    """A concurrency key and its limit (docs/flow-control.md); a run's create request may override it."""
    priority: int | None = Field(default=None, ge=0, le=MAX_PRIORITY)
    """The default priority of this workflow's runs (0 when not given; higher is claimed first)."""
    schedule: ScheduleTiming | None = None
    """Runs on a clock (Dagu's `schedule:`); the newest version stored keeps it (docs/triggers.md)."""
    triggers: list[EventTrigger] | None = Field(default=None, max_length=50)
    """Events that start runs of this workflow (docs/triggers.md)."""

    def input_json_schema(self) -> dict[str, Any] | None:
        """`inputSchema`, else the schema `defaultParams` describes, else None."""
        if self.input_schema is not None:
            return self.input_schema
        if self.default_params is not None:
            return parse_default_params(self.default_params)
        return None

    @model_validator(mode="after")
    def _check_concurrency_key(self) -> WorkflowDefinitionSpec:
        # A key that reads a field the input schema does not declare would render the same
        # (empty) key for every run: refused here, naming the field.
        schema = self.input_json_schema() if self.concurrency is not None else None
        if self.concurrency is not None and schema is not None:
            for path in key_paths(self.concurrency.key):
                if schema_lacks(schema, path[1:]):
                    raise PydanticValidationError.from_exception_data(
                        type(self).__name__,
                        [
                            InitErrorDetails(
                                type=PydanticCustomError(
                                    "unknown_input_path",
                                    "{message}",
                                    {
                                        "message": f"the concurrency key reads {'.'.join(path)}, "
                                        "which the input schema does not declare"
                                    },
                                ),
                                loc=("concurrency", "key"),
                                input=self.concurrency.key,
                            )
                        ],
                    )
        return self

    @model_validator(mode="after")
    def _check_cross_step_rules(self) -> WorkflowDefinitionSpec:
        refs = [
            _StepRef(
                step.name,
                step.type,
                getattr(step, "true_step", None),
                getattr(step, "false_step", None),
                getattr(step, "goto_targets", None),
            )
            for step in self.steps
        ]
        problems = _cross_step_problems(refs, check_targets=True)
        if problems:
            raise PydanticValidationError.from_exception_data(
                type(self).__name__,
                [
                    InitErrorDetails(
                        type=PydanticCustomError(kind, "{message}", {"message": message}),
                        loc=loc,
                        input=value,
                    )
                    for loc, kind, message, value in problems
                ],
            )
        return self

    def step(self, name: str) -> StepDefinition:
        """The step called `name`; `KeyError` if there is none."""
        return self.steps[self.index_of(name)]

    def index_of(self, name: str) -> int:
        """Position of the step called `name` in definition order; `KeyError` if there is none."""
        for index, step in enumerate(self.steps):
            if step.name == name:
                return index
        raise KeyError(f"workflow {self.name!r} has no step named {name!r}")


def parse_definition(data: Any) -> WorkflowDefinitionSpec:
    """Validate an untrusted definition, reporting every problem at once.

    Raises `stevora.errors.ValidationError` whose details list `{"path", "message"}` pairs,
    ordered by step. Pydantic skips a model's own rules (unique step and tool names, branch
    targets) when any of its fields is invalid, so those are also checked here on the raw
    input, to report them in the same response.
    """
    try:
        return WorkflowDefinitionSpec.model_validate(data)
    except PydanticValidationError as exc:
        problems = problems_from_pydantic(exc)
        seen = {(problem["path"], problem["message"]) for problem in problems}
        for loc, _, message, _ in _raw_cross_step_problems(data):
            if (_format_path(loc), message) not in seen:
                problems.append({"path": _format_path(loc), "message": message})
        problems.sort(key=_step_position)
        raise ValidationError.from_problems(problems) from exc


def problems_from_pydantic(exc: PydanticValidationError) -> list[dict[str, str]]:
    """Pydantic errors as `{"path": "steps[1].maxToolRounds", "message": ...}` dicts."""
    problems: list[dict[str, str]] = []
    for error in exc.errors(include_url=False):
        loc = tuple(error["loc"])
        message = error["msg"]
        ctx = error.get("ctx") or {}
        if (
            error["type"] in ("union_tag_invalid", "union_tag_not_found")
            and ctx.get("discriminator") == "'type'"
        ):
            loc = (*loc, "type")
            allowed = ", ".join(STEP_TYPES)
            if error["type"] == "union_tag_invalid":
                message = f"Unknown step type '{ctx.get('tag')}'; expected one of: {allowed}"
            else:
                message = f"Step type is required; expected one of: {allowed}"
        elif error["type"] == "extra_forbidden" and loc and isinstance(loc[-1], str):
            message = _unknown_field_message(loc[-1])
        problems.append({"path": _format_path(loc), "message": message})
    return problems


class _StepRef(NamedTuple):
    name: Any
    type: Any
    true_step: Any
    false_step: Any
    goto_targets: Any = None


_Problem = tuple[tuple[str | int, ...], str, str, Any]
"""(loc, error type, message, offending input)"""


def _cross_step_problems(refs: list[_StepRef], *, check_targets: bool) -> list[_Problem]:
    """Duplicate step names, condition targets that name no step (or the step itself), and llm
    steps' `gotoTargets` that name no step."""
    problems: list[_Problem] = []
    for index, name, first in find_duplicates([ref.name for ref in refs]):
        message = f"Duplicate step name '{name}' (already used by steps[{first}])"
        problems.append((("steps", index, "name"), _DUPLICATE_STEP, message, name))
    if not check_targets:
        return problems
    names = {ref.name for ref in refs}
    for index, ref in enumerate(refs):
        if ref.type == "llm" and isinstance(ref.goto_targets, list):
            for position, target in enumerate(ref.goto_targets):
                if isinstance(target, str) and target not in names:  # else already a field error
                    message = f"gotoTargets '{target}' does not name a step in this workflow"
                    problems.append(
                        (("steps", index, "gotoTargets", position), _UNKNOWN_TARGET, message, target)
                    )
        if ref.type != "condition":
            continue
        for alias, target in (("trueStep", ref.true_step), ("falseStep", ref.false_step)):
            if not isinstance(target, str):
                continue  # a missing or non-string target is already a field error
            loc = ("steps", index, alias)
            if target not in names:
                message = f"{alias} '{target}' does not name a step in this workflow"
                problems.append((loc, _UNKNOWN_TARGET, message, target))
            elif target == ref.name:
                # The state cannot change between two evaluations, so this would loop forever.
                message = f"{alias} '{target}' is the condition step itself"
                problems.append((loc, _SELF_TARGET, message, target))
    return problems


def _raw_cross_step_problems(data: Any) -> list[_Problem]:
    """The models' own rules applied to unvalidated input, as far as its shape allows."""
    if not isinstance(data, Mapping) or not isinstance(data.get("steps"), list):
        return []
    steps = [raw if isinstance(raw, Mapping) else {} for raw in data["steps"]]
    refs = [
        _StepRef(
            step.get("name"),
            step.get("type"),
            step.get("trueStep", step.get("true_step")),
            step.get("falseStep", step.get("false_step")),
            step.get("gotoTargets", step.get("goto_targets")),
        )
        for step in steps
    ]
    # A target may name a step whose own name is unusable; saying "no such step" would mislead.
    names_usable = all(isinstance(ref.name, str) for ref in refs)
    problems = _cross_step_problems(refs, check_targets=names_usable)
    for step_index, step in enumerate(steps):
        tools = step.get("tools")
        if step.get("type") != "llm" or not isinstance(tools, list):
            continue
        # An MCP entry's "name" is its prefix (`McpToolsDef.name`): the server's name by default.
        tool_names = [
            tool
            if isinstance(tool, str)
            else (_get(tool, "name") or _get(tool, "prefix") or _get(tool, "mcp"))
            for tool in tools
        ]
        for index, name, first in find_duplicates(tool_names):
            message = DUPLICATE_TOOL_MESSAGE.format(name=name, first=first)
            problems.append(
                (("steps", step_index, "tools", index, "name"), "duplicate_tool_name", message, name)
            )
    return problems


def _get(value: Any, key: str) -> Any:
    return value.get(key) if isinstance(value, Mapping) else None


_STEP_PATH = re.compile(r"^steps\[(\d+)\]")


def _step_position(problem: dict[str, str]) -> int:
    """Sort key putting definition-level problems first, then each step's in step order."""
    match = _STEP_PATH.match(problem["path"])
    return int(match.group(1)) if match else -1


# Discriminated unions put the chosen tag into error locations: ('steps', 1, 'llm', 'model').
_TAGS_UNDER = {
    "steps": frozenset(STEP_TYPES),
    "tools": frozenset({INLINE_TOOL_TAG, TOOL_REF_TAG, WORKFLOW_TOOL_TAG, MCP_TOOL_TAG}),
    "parts": frozenset({"text", "image", "file"}),
}
# Tags right under a field (a message's `content`: a string or a list of parts).
_TAGS_AFTER = {"content": frozenset({"text", "parts"})}
_IDENTIFIER = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")


def _format_path(loc: tuple[str | int, ...]) -> str:
    """`('steps', 1, 'llm', 'tools', 0, 'inline', 'name')` -> `steps[1].tools[0].name`."""
    path = ""
    for position, item in enumerate(loc):
        if isinstance(item, int):
            path += f"[{item}]"
            continue
        if position >= 1 and item in _TAGS_AFTER.get(str(loc[position - 1]), ()):
            continue
        if position >= 2 and isinstance(loc[position - 1], int):
            parent = loc[position - 2]
            if isinstance(parent, str) and item in _TAGS_UNDER.get(parent, ()):
                continue
        if _IDENTIFIER.fullmatch(item):
            path += f".{item}" if path else item
        else:
            path += f"[{json.dumps(item)}]"
    return path


def _field_names(models: Iterable[type[CamelModel]]) -> list[str]:
    return sorted({field.alias or name for model in models for name, field in model.model_fields.items()})


_KNOWN_FIELDS = _field_names(
    (
        WorkflowDefinitionSpec,
        TaskStep,
        WaitStep,
        ConditionStep,
        ExternalEventStep,
        ApprovalStep,
        LlmStep,
        ToolStep,
        LlmMessage,
        TextPart,
        ImagePart,
        FilePart,
        LlmToolDef,
        ToolRef,
        WorkflowToolDef,
        McpToolsDef,
        GuardrailCheck,
        GuardrailConfig,
        RetryPolicy,
        Budget,
    )
)


def _unknown_field_message(key: str) -> str:
    message = f"Unknown field '{key}'"
    close = difflib.get_close_matches(key, _KNOWN_FIELDS, n=1, cutoff=0.8)
    return f"{message} (did you mean '{close[0]}'?)" if close else message
