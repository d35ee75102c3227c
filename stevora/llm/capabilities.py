"""What one OpenAI-compatible server accepts, by server name in the compatible provider's settings.

See docs/providers.md. A leaf module: the compatible provider's settings and the Chat Completions
adapter both read it, and neither should import the other for it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

ToolChoiceKind = Literal["required", "none", "named"]


class ServerCapabilities(BaseModel):
    """What one OpenAI-compatible server accepts; the defaults suit llama.cpp's server.

    See docs/providers.md for each known server and how the adapter uses every field.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    tool_choice: frozenset[ToolChoiceKind] = frozenset({"none", "named"})
    """`tool_choice` values besides `auto` the server honours (`named` = one named function)."""
    send_auto: bool = False
    """Send `tool_choice: "auto"` explicitly instead of leaving it to the server's default.
    llama-cpp-python offers the tools to the model only when it is sent; vLLM rejects it unless
    started with `--enable-auto-tool-choice`."""
    tool_call_content: Literal["empty", "null", "omit"] = "empty"
    """How an assistant turn with tool calls and no text carries `content`: `""`, `null` or no key."""
    parallel_tool_calls: bool = False
    """Whether the server takes the `parallel_tool_calls` parameter (it is left out otherwise)."""
    usage: bool = True
    """Whether answers carry `usage`; a server that should but does not is logged."""
    stream_usage: bool = False
    """Whether streams carry usage when asked with `stream_options.include_usage`."""
    prompt_cache_key: bool = False
    """Whether the server takes `prompt_cache_key` (OpenAI's routing hint for its prefix cache:
    one key per run, or per thread of runs, so a run's requests land where its prefix is cached)."""
    json_schema: bool = False
    """Whether the server takes `response_format: {"type": "json_schema", "strict": true}` and
    holds its answer to the schema (a step's `outputSchema` in `native` mode; the final-answer
    tool otherwise: docs/providers.md, "Structured outputs")."""
