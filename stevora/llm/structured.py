"""Structured outputs, the provider-neutral half: the forced final-answer tool and the prompt form.

An adapter asked for `structured_output` on a request with an `output_schema` decides what it can
send (its native mode, else `tool`, else `prompt`: docs/providers.md, "Structured outputs") and
says on the response what it did (`LlmResponse.structured_output`) and why it fell back
(`structured_fallback`). The engine records both on the call's `LLM_CALL_COMPLETED` event.

Every API path plugs in the same way: `plan_structured(request, native=native_schema(schema,
"openai"), tool_ok=..., provider=...)` gives the plan; the Responses API path
(`openai_responses.build_kwargs`) sends `plan.native_schema` as `text: {"format": {"type":
"json_schema", "name": STRUCTURED_NAME, "schema": ..., "strict": true}}` (the same strict rules as
Chat Completions), the final-answer tool in its own flat tool form for `tool`, and ends with
`plan.finish(response)`. Anthropic with thinking on cannot force a tool: its plan has
`tool_ok=False` and a `no_tool_reason`, so it falls back from native to the prompt.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from stevora.definitions.output_schema import (
    FINAL_ANSWER_TOOL,
    SchemaProblem,
    StructuredOutput,
    full_schema,
    tool_problems,
)
from stevora.llm.messages import LlmRequest, LlmResponse, NamedTool, ToolSpec
from stevora.llm.provider import JSON_INSTRUCTION, parse_tool_input

STRUCTURED_NAME = "answer"
"""The name a native structured output is sent under (OpenAI's `json_schema.name`)."""

FINAL_ANSWER_DESCRIPTION = (
    "Give your final answer. Call this exactly once, when you are done, with the answer."
)


def schema_instruction(output_schema: dict[str, Any]) -> str:
    """The prompt form: the answer's schema said in words (the check and re-prompts enforce it)."""
    schema = json.dumps(full_schema(output_schema), separators=(",", ":"), sort_keys=True)
    return f"{JSON_INSTRUCTION} It must match this JSON Schema: {schema}"


def with_final_answer_tool(request: LlmRequest) -> LlmRequest:
    """`request` with the final-answer tool added and a tool choice that makes the model call a
    tool: the final-answer tool when it is the only one (or the step said `none`), any tool
    otherwise (the model finishes by calling the final-answer tool). A named first call stays."""
    tool = ToolSpec(FINAL_ANSWER_TOOL, FINAL_ANSWER_DESCRIPTION, full_schema(request.output_schema or {}))
    choice = request.tool_choice
    tools = [*request.tools, tool]
    if choice == "none" or not request.tools:
        tools, choice = [tool], NamedTool(FINAL_ANSWER_TOOL)
    elif not isinstance(choice, NamedTool):
        choice = "required"
    return dataclasses.replace(request, tools=tools, tool_choice=choice)


def take_final_answer(response: LlmResponse) -> LlmResponse:
    """A call of the final-answer tool turned into the answer's text (its arguments as JSON).

    Calls the model made beside it in the same turn are not run: the answer ends the step
    (docs/providers.md). A response without that call is returned as it is.
    """
    answer = next((c for c in response.tool_calls if c.name == FINAL_ANSWER_TOOL), None)
    if answer is None:
        return response
    text = json.dumps(parse_tool_input(answer.arguments), separators=(",", ":"), ensure_ascii=False)
    return dataclasses.replace(response, text=text, tool_calls=[], finish_reason="stop")


@dataclass(slots=True)
class StructuredPlan:
    """What an adapter sends for one request's `output_schema`, and how it reads the answer."""

    request: LlmRequest
    mode: StructuredOutput | None = None
    fallback: str | None = None
    native_schema: dict[str, Any] | None = None
    instruction: str | None = None

    def finish(self, response: LlmResponse) -> LlmResponse:
        """The answer as the step reads it: the final-answer call as text, the form sent on it."""
        if self.mode is None:
            return response
        if self.mode == "tool":
            response = take_final_answer(response)
        response.structured_output = self.mode
        response.structured_fallback = self.fallback
        return response


def plan_structured(
    request: LlmRequest,
    *,
    native: tuple[dict[str, Any] | None, SchemaProblem | None] | None,
    tool_ok: bool,
    provider: str,
    no_tool_reason: str | None = None,
) -> StructuredPlan:
    """The best form of the one asked for: native (when `native`, the provider's strict schema or
    its problem, is given), else the final-answer tool (when `tool_ok`), else the prompt.
    `no_tool_reason` says why the tool cannot be forced, in the fallback reason (default: the
    provider cannot force it)."""
    wanted = request.structured_output
    if request.output_schema is None or wanted is None:
        return StructuredPlan(request)
    fallback: str | None = None
    if wanted == "native":
        if native is None:
            fallback = f"{provider} has no native structured output"
        elif native[1] is not None:
            problem = native[1]
            fallback = f"outputSchema{path_text(problem.path)}: {problem.message}"
        else:
            return StructuredPlan(request, "native", native_schema=native[0])
    if wanted in ("native", "tool"):
        problems = tool_problems(request.output_schema)
        if tool_ok and not problems:
            return StructuredPlan(with_final_answer_tool(request), "tool", fallback)
        if not tool_ok and no_tool_reason is not None:
            why = no_tool_reason
        else:
            why = problems[0].message if problems else f"{provider} cannot force the final-answer tool call"
        fallback = f"{fallback}; {why}" if fallback else why
    return StructuredPlan(request, "prompt", fallback, instruction=schema_instruction(request.output_schema))


def path_text(path: tuple[str | int, ...]) -> str:
    """`("properties", "x")` → `.properties.x`; list indexes as `[0]`."""
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in path)
