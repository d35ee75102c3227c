"""The `llm` step: model, prompts, tools, guardrails and the tool-loop limits (docs/definitions.md
`llm`, docs/tool-calling.md)."""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from jsonschema.exceptions import SchemaError
from jsonschema.validators import Draft202012Validator, validator_for
from pydantic import (
    AfterValidator,
    BeforeValidator,
    Discriminator,
    Field,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic import ValidationError as PydanticValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

from stevora.definitions.llm_messages import LlmMessage
from stevora.definitions.output_schema import (
    FINAL_ANSWER_TOOL,
    StructuredOutput,
    native_problems,
    tool_problems,
)
from stevora.definitions.retry import CamelModel
from stevora.definitions.steps import StepBase, find_duplicates

MAX_TOOLS_PER_STEP = 128
# The strictest of the providers' rules (OpenAI and Anthropic both accept exactly this), so a
# definition that validates here is accepted by every provider it may fall back to.
_TOOL_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
DUPLICATE_TOOL_MESSAGE = "Duplicate tool name '{name}' (already used by tools[{first}])"
INLINE_TOOL_TAG = "inline"
TOOL_REF_TAG = "ref"
WORKFLOW_TOOL_TAG = "workflow"
MCP_TOOL_TAG = "mcp"
# An MCP server's name (docs/mcp.md): short enough that `<server>_<tool>` leaves room for the tool.
_MCP_SERVER_RE = r"^[A-Za-z][A-Za-z0-9_-]{0,31}$"


def _check_tool_name(name: str) -> str:
    if not _TOOL_NAME_RE.fullmatch(name):
        raise PydanticCustomError(
            "tool_name",
            "Tool name must be 1-64 characters of letters, digits, '_' or '-' (got '{name}')",
            {"name": name},
        )
    return name


ToolName = Annotated[str, AfterValidator(_check_tool_name)]


def _check_parameters_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """Providers want an object schema for arguments; anything else fails only at call time."""
    if schema.get("type") != "object":
        raise PydanticCustomError(
            "tool_parameters_not_object",
            'Tool parameters must be a JSON Schema with "type": "object"',
        )
    return _check_json_schema(schema)


def _check_json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    # An explicit default: with an unknown "$schema", jsonschema would otherwise warn.
    validator_cls = validator_for(schema, default=Draft202012Validator)
    try:
        validator_cls.check_schema(schema)
    except SchemaError as exc:
        where = "" if exc.json_path == "$" else f" at {exc.json_path}"
        raise PydanticCustomError(
            "tool_parameters_invalid",
            "Tool parameters are not a valid JSON Schema{where}: {reason}",
            {"where": where, "reason": exc.message},
        ) from exc
    return schema


class LlmToolDef(CamelModel):
    """A tool declared inline: the model sees its description and argument schema.

    `execution: "handler"` (the default) runs the handler registered under `name` in the worker;
    `"client"` hands the call to the API caller (the run waits, durably, for
    `POST /v1/workflow-runs/{id}/tool-outputs`). `timeoutMs` bounds the handler's run, or the wait
    for a client's output (counted from the commit of the model call that asked for it).
    """

    name: ToolName
    description: str = Field(max_length=1024)
    parameters: Annotated[dict[str, Any], AfterValidator(_check_parameters_schema)]
    execution: Literal["handler", "client"] = "handler"
    timeout_ms: int | None = Field(default=None, ge=1)
    output_schema: Annotated[dict[str, Any], AfterValidator(_check_json_schema)] | None = None
    """A result that does not match is a failed call (TOOL_OUTPUT_INVALID) returned to the model."""
    requires_approval: bool = False
    """Each call waits for a person to approve, edit or reject it before it runs."""
    outputs_expire_after_ms: int | None = Field(default=None, ge=1)
    """Client tools: with no output this long after the model asked, the run fails with
    CONTEXT_EXPIRED (overrides the step's `outputsExpireAfterMs`)."""

    @model_validator(mode="after")
    def _expiry_is_for_client_tools(self) -> LlmToolDef:
        if self.outputs_expire_after_ms is not None and self.execution != "client":
            raise PydanticCustomError(
                "expiry_needs_client",
                'outputsExpireAfterMs applies to client tools only (execution: "client")',
            )
        return self


class WorkflowToolDef(CamelModel):
    """A whole workflow offered to the model as a tool: calling it starts a child run whose output
    is the tool result. `parameters` and `description` default to the child definition's
    `inputSchema` (or `defaultParams`) and `description`; without `version` the newest version at
    the time of the call runs."""

    name: ToolName
    workflow: str = Field(min_length=1, max_length=200)
    version: str | None = Field(default=None, min_length=1, max_length=50)
    description: str | None = Field(default=None, max_length=1024)
    parameters: Annotated[dict[str, Any], AfterValidator(_check_parameters_schema)] | None = None


class ToolRef(CamelModel):
    """A tool named by reference: its description and schema come from the worker's registry.

    Written as a bare string (`"search_docs"`) or `{"name": "search_docs"}`; `ToolRef("x")`
    works in Python too.
    """

    name: ToolName

    def __init__(self, name: str | None = None, /, **data: Any) -> None:
        if name is not None:
            data["name"] = name
        super().__init__(**data)

    @model_validator(mode="before")
    @classmethod
    def _from_bare_string(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value


class McpToolsDef(CamelModel):
    """The tools of an MCP server (docs/mcp.md): `{"mcp": "files"}` offers all of them as
    `files_<tool>`; `include` / `exclude` narrow the list by the server's own tool names; `prefix`
    replaces the server name in the offered names; `approve` lists tools (bare names) each of whose
    calls waits for a person's approval first."""

    mcp: str = Field(pattern=_MCP_SERVER_RE)
    include: list[Annotated[str, Field(min_length=1, max_length=200)]] | None = Field(
        default=None, max_length=500
    )
    exclude: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(
        default_factory=list, max_length=500
    )
    prefix: str | None = Field(default=None, pattern=_MCP_SERVER_RE)
    approve: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(
        default_factory=list, max_length=500
    )

    @property
    def name(self) -> str:
        """The prefix of the offered names: two entries with one prefix would offer one name twice."""
        return self.prefix or self.mcp


def _tool_kind(value: Any) -> str:
    """Tell a reference from an inline or workflow tool without trying all (which multiplies errors)."""
    if isinstance(value, str | ToolRef):
        return TOOL_REF_TAG
    if isinstance(value, WorkflowToolDef) or (isinstance(value, dict) and "workflow" in value):
        return WORKFLOW_TOOL_TAG
    if isinstance(value, McpToolsDef) or (isinstance(value, dict) and "mcp" in value):
        return MCP_TOOL_TAG
    if isinstance(value, dict) and set(value) <= {"name"}:
        return TOOL_REF_TAG
    return INLINE_TOOL_TAG


LlmTool = Annotated[
    Annotated[LlmToolDef, Tag(INLINE_TOOL_TAG)]
    | Annotated[ToolRef, Tag(TOOL_REF_TAG)]
    | Annotated[WorkflowToolDef, Tag(WORKFLOW_TOOL_TAG)]
    | Annotated[McpToolsDef, Tag(MCP_TOOL_TAG)],
    Discriminator(_tool_kind),
]


class NamedToolChoice(CamelModel):
    """`{"name": "<tool>"}`: the step's first model call must call this tool."""

    name: ToolName


_TOOL_CHOICE_MODES = ("auto", "required", "none")


def _parse_tool_choice(value: Any) -> Any:
    """One clear error for every malformed value, instead of one per union member."""
    if isinstance(value, NamedToolChoice) or (isinstance(value, str) and value in _TOOL_CHOICE_MODES):
        return value
    if isinstance(value, dict) and set(value) == {"name"} and isinstance(value["name"], str):
        return NamedToolChoice(name=_check_tool_name(value["name"]))
    raise PydanticCustomError(
        "tool_choice",
        'toolChoice must be "auto", "required", "none" or {"name": "<tool>"} (got {value})',
        {"value": json.dumps(value, default=str)},
    )


ToolChoice = Annotated[
    Literal["auto", "required", "none"] | NamedToolChoice, BeforeValidator(_parse_tool_choice)
]


class GuardrailCheck(CamelModel):
    """One post-completion check; `config` is check-specific (e.g. a blocklist)."""

    type: Literal["content_safety", "schema_validation", "confidence_threshold"]
    config: dict[str, Any] = Field(default_factory=dict)


class GuardrailConfig(CamelModel):
    """Checks run on the final answer and what a failure does to the step."""

    post_checks: list[GuardrailCheck] = Field(default_factory=list)
    on_failure: Literal["block", "warn", "retry_with_feedback"] = "warn"
    max_feedback_attempts: int = Field(default=2, ge=1, le=5)
    """How many re-prompts `retry_with_feedback` makes before the step fails."""


class ContextConfig(CamelModel):
    """Keeping a long step's input inside the model's window (docs/long-horizon.md)."""

    max_input_tokens: int = Field(ge=256, le=10_000_000)
    """Before a round whose input would be over this (the previous round's reported input tokens
    plus an estimate of what was added since), the strategy makes room."""
    strategy: Literal["trim_tool_results", "compact"] = "trim_tool_results"
    """`trim_tool_results`: the results of the rounds before the last `keepLastRounds` are replaced
    by a short stub naming the call (each call keeps its result message, so pairs stay valid).
    `compact`: one model call (no tools) summarises everything before the last `keepLastRounds`
    rounds, and the summary replaces them in every later request (a recorded checkpoint)."""
    keep_last_rounds: int = Field(default=3, ge=0, le=1000)
    model: str | None = Field(default=None, min_length=1, max_length=200)
    """`compact` only: the model that writes the summary (default: the step's `model`)."""

    @model_validator(mode="after")
    def _model_is_for_compact(self) -> ContextConfig:
        if self.model is not None and self.strategy != "compact":
            raise PydanticCustomError(
                "context_model_needs_compact", 'context.model applies to strategy "compact" only'
            )
        return self


# Anthropic's floor for a thinking budget (the API answers 400 below it).
MIN_THINKING_BUDGET_TOKENS = 1024


class ThinkingConfig(CamelModel):
    """Anthropic extended thinking (docs/providers.md, "thinking")."""

    budget_tokens: int = Field(ge=MIN_THINKING_BUDGET_TOKENS, le=1_000_000)
    """Tokens the model may think with; less than the step's `maxTokens` (the API's rule)."""


class ReasoningConfig(CamelModel):
    """OpenAI reasoning models (docs/providers.md, "api: responses")."""

    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None


# The largest `STEVORA_MAX_TOOL_ROUNDS` a server may be configured with.
MAX_TOOL_ROUNDS_CEILING = 10_000


class LlmStep(StepBase):
    """Calls a model, runs the tool loop, applies guardrails and stores the answer."""

    type: Literal["llm"] = "llm"
    model: str = Field(min_length=1, max_length=200)
    provider: str | None = Field(default=None, min_length=1)
    """An explicit provider name; wins over routing by model-name prefix."""
    fallback_models: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(default_factory=list)
    system_prompt: str | None = None
    messages: list[LlmMessage] = Field(min_length=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    max_tokens: int | None = Field(default=None, ge=1)
    response_format: Literal["json", "text"] | None = None
    structured_output: StructuredOutput | None = None
    """How the provider is held to `outputSchema` (docs/providers.md, "Structured outputs"):
    `native` (the default: OpenAI's strict `json_schema`, Anthropic's `output_config.format`),
    `tool` (a forced `final_answer` tool) or `prompt` (an instruction, then the check and
    re-prompts). Unset means `native`, falling back to `tool` where the provider or the schema
    cannot; set to `native`, a schema strict mode refuses is a definition error."""
    output_schema: dict[str, Any] | None = None
    tools: list[LlmTool] = Field(default_factory=list, max_length=MAX_TOOLS_PER_STEP)
    guardrails: GuardrailConfig | None = None
    max_tool_rounds: int = Field(default=10, ge=1, le=MAX_TOOL_ROUNDS_CEILING)
    """Bounded here by the largest ceiling a server may set; each server refuses more than its own
    STEVORA_MAX_TOOL_ROUNDS (default 500) when the definition is stored."""
    on_max_tool_rounds: Literal["fail", "complete"] = "fail"
    """At the round limit: `fail` (error MAX_TOOL_ROUNDS, the documented behaviour) or `complete`."""
    tool_timeout_ms: int = Field(default=30_000, ge=1, le=3_600_000)
    parallel_tool_calls: bool = True
    tool_choice: ToolChoice = "auto"
    """Applies to the first model call of each step visit; later rounds use `auto`, so
    `required` cannot loop forever."""
    timeout_ms: int | None = Field(default=None, ge=1)
    """Timeout of each provider request; unset means the provider adapter's default."""
    output_key: str | None = Field(default=None, min_length=1)
    context: ContextConfig | None = None
    """Without it, a conversation over the model's window fails the step with CONTEXT_TOO_LONG."""
    cache: bool = True
    """Prompt caching: `cache_control` breakpoints for Anthropic, `prompt_cache_key` (the run's id)
    for OpenAI (docs/long-horizon.md). `false` sends no cache hints."""
    global_tools: bool = True
    """Offer the worker's global tools (`register_tool(..., global_=True)`) besides `tools`."""
    outputs_expire_after_ms: int | None = Field(default=None, ge=1)
    """With a client tool's output still missing this long after the model asked for it, the run
    fails with CONTEXT_EXPIRED (a call's own, shorter `timeoutMs` fails just that call instead)."""
    goto_targets: list[Annotated[str, Field(min_length=1, max_length=100)]] | None = Field(
        default=None, max_length=100
    )
    """The steps this step's tools may send the run to with `ctx.goto` (each must name a step of
    the workflow, checked when the definition is stored); unset: any step of the workflow."""
    api: Literal["chat", "responses"] | None = None
    """OpenAI-protocol providers: Chat Completions (`chat`) or the Responses API (`responses`);
    unset: the provider's default (docs/providers.md, "api: responses")."""
    reasoning: ReasoningConfig | None = None
    """OpenAI reasoning models: `{"effort": ...}` (sent on both APIs)."""
    thinking: ThinkingConfig | None = None
    """Anthropic extended thinking: `{"budgetTokens": N}`; its blocks go back with every later round."""

    @field_validator("thinking")
    @classmethod
    def _thinking_fits(cls, thinking: ThinkingConfig | None, info: ValidationInfo) -> ThinkingConfig | None:
        # The Messages API's rules for thinking, refused here rather than as a 400 at run time.
        if thinking is None:
            return None
        max_tokens = info.data.get("max_tokens")
        if max_tokens is not None and thinking.budget_tokens >= max_tokens:
            raise PydanticCustomError(
                "thinking_budget_too_large",
                "thinking.budgetTokens ({budget}) must be less than maxTokens ({max_tokens})",
                {"budget": thinking.budget_tokens, "max_tokens": max_tokens},
            )
        temperature = info.data.get("temperature")
        if temperature is not None and temperature != 1:
            raise PydanticCustomError(
                "thinking_with_temperature",
                "thinking cannot be combined with temperature {temperature} (the API takes only 1 with thinking)",
                {"temperature": temperature},
            )
        choice = info.data.get("tool_choice")
        if isinstance(choice, NamedToolChoice) or choice == "required":
            raise PydanticCustomError(
                "thinking_with_forced_tool",
                "thinking cannot be combined with a forced toolChoice ('required' or a named tool); "
                "the API takes only 'auto' or 'none' with thinking",
            )
        return thinking

    @field_validator("tools")
    @classmethod
    def _unique_tool_names(
        cls, tools: list[LlmToolDef | ToolRef | WorkflowToolDef | McpToolsDef]
    ) -> list[LlmToolDef | ToolRef | WorkflowToolDef | McpToolsDef]:
        # The model calls tools by name, so two tools with one name make calls ambiguous.
        duplicates = find_duplicates([tool.name for tool in tools])
        if duplicates:
            raise PydanticValidationError.from_exception_data(
                cls.__name__,
                [
                    InitErrorDetails(
                        type=PydanticCustomError(
                            "duplicate_tool_name", DUPLICATE_TOOL_MESSAGE, {"name": name, "first": first}
                        ),
                        loc=(index, "name"),
                        input=name,
                    )
                    for index, name, first in duplicates
                ],
            )
        return tools

    @field_validator("output_schema")
    @classmethod
    def _output_schema_fits_its_mode(
        cls, schema: dict[str, Any] | None, info: ValidationInfo
    ) -> dict[str, Any] | None:
        mode = info.data.get("structured_output")
        if schema is None or mode in (None, "prompt"):
            return schema
        problems = native_problems(schema) if mode == "native" else tool_problems(schema)
        if problems:
            raise PydanticValidationError.from_exception_data(
                cls.__name__,
                [
                    InitErrorDetails(
                        type=PydanticCustomError(
                            "output_schema_not_native",
                            "structuredOutput '{mode}': {reason}",
                            {"mode": mode, "reason": problem.message},
                        ),
                        loc=problem.path,
                        input=schema,
                    )
                    for problem in problems
                ],
            )
        return schema

    @model_validator(mode="after")
    def _final_answer_tool_is_reserved(self) -> LlmStep:
        if self.output_schema is None or self.structured_output == "prompt":
            return self
        for index, tool in enumerate(self.tools):
            if tool.name == FINAL_ANSWER_TOOL and not isinstance(tool, McpToolsDef):
                raise PydanticValidationError.from_exception_data(
                    type(self).__name__,
                    [
                        InitErrorDetails(
                            type=PydanticCustomError(
                                "final_answer_reserved",
                                "The tool name '{name}' is reserved for the answer of a step with an "
                                'outputSchema (set structuredOutput: "prompt" to use it)',
                                {"name": FINAL_ANSWER_TOOL},
                            ),
                            loc=("tools", index, "name"),
                            input=tool.name,
                        )
                    ],
                )
        return self

    @model_validator(mode="after")
    def _no_forced_answer_tool_with_thinking(self) -> LlmStep:
        # Anthropic refuses a forced tool_choice with thinking on, and the final-answer tool must
        # be forced; unset or `native`, a thinking step falls back to `prompt` instead.
        if self.thinking is not None and self.output_schema is not None and self.structured_output == "tool":
            raise PydanticValidationError.from_exception_data(
                type(self).__name__,
                [
                    InitErrorDetails(
                        type=PydanticCustomError(
                            "thinking_with_tool_output",
                            "structuredOutput 'tool' cannot be combined with thinking: the final-answer "
                            "tool must be forced, and the API takes no forced toolChoice with thinking "
                            "(use 'native' or 'prompt')",
                        ),
                        loc=("structuredOutput",),
                        input=self.structured_output,
                    )
                ],
            )
        return self

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice_names_a_tool(
        cls, choice: str | NamedToolChoice, info: ValidationInfo
    ) -> str | NamedToolChoice:
        tools: list[LlmToolDef | ToolRef | WorkflowToolDef | McpToolsDef] | None = info.data.get("tools")
        if tools is None:  # the tools failed validation; their own error says why
            return choice
        names = [tool.name for tool in tools]
        # An MCP server's tools are known only when the step runs: a name under its prefix may be one.
        prefixes = tuple(f"{tool.name}_" for tool in tools if isinstance(tool, McpToolsDef))
        if (
            isinstance(choice, NamedToolChoice)
            and choice.name not in names
            and not (prefixes and choice.name.startswith(prefixes))
        ):
            raise PydanticCustomError(
                "tool_choice_unknown_tool",
                "toolChoice names '{name}', which is not one of this step's tools ({known})",
                {"name": choice.name, "known": ", ".join(names) or "none declared"},
            )
        if choice == "required" and not names:
            raise PydanticCustomError(
                "tool_choice_without_tools", "toolChoice 'required' needs at least one tool in 'tools'"
            )
        return choice

    def effective_output_key(self) -> str:
        """The state key the step's result is written to: `output_key`, else the step name."""
        return self.output_key if self.output_key is not None else self.name
