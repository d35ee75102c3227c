"""OpenAI Chat Completions adapter; also the adapter for OpenAI-compatible servers.

Ollama, vLLM, llama.cpp and OpenRouter speak the same `/v1/chat/completions` dialect: give a
`base_url` and a distinct `name` (the name is what routing, traces and pricing see).
"""

from __future__ import annotations

from typing import Any, Literal

import openai
from openai.types.chat import ChatCompletion

from stevora.errors import ProviderError
from stevora.llm.messages import LlmRequest, LlmResponse, Message, ToolCall, ToolSpec, Usage
from stevora.llm.provider import (
    JSON_INSTRUCTION,
    connection_error,
    error_message_from_body,
    mentions_json,
    provider_error_for_status,
    timeout_error,
)

MaxTokensField = Literal["max_tokens", "max_completion_tokens"]


class OpenAIProvider:
    """`Provider` backed by `openai.AsyncOpenAI().chat.completions.create` (non-streaming)."""

    def __init__(
        self,
        api_key: str,
        base_url: str | None = None,
        *,
        name: str = "openai",
        max_retries: int = 2,
        timeout_s: float = 60.0,
        client: openai.AsyncOpenAI | None = None,
        max_tokens_field: MaxTokensField | None = None,
    ) -> None:
        self.name = name
        self._owns_client = client is None
        self._client = client or openai.AsyncOpenAI(
            api_key=api_key, base_url=base_url, max_retries=max_retries, timeout=timeout_s
        )
        # OpenAI's reasoning models reject `max_tokens`; many compatible servers only know it.
        self._max_tokens_field: MaxTokensField = max_tokens_field or (
            "max_completion_tokens" if name == "openai" else "max_tokens"
        )

    async def complete(self, request: LlmRequest) -> LlmResponse:
        kwargs = self.build_kwargs(request)
        try:
            completion = await self._client.chat.completions.create(**kwargs)
        except openai.APIStatusError as exc:
            message = error_message_from_body(exc.body, exc.message)
            raise provider_error_for_status(
                self.name, exc.status_code, message, exc.response.headers
            ) from exc
        except openai.APITimeoutError as exc:
            raise timeout_error(self.name) from exc
        except openai.APIConnectionError as exc:
            raise connection_error(self.name, str(exc.__cause__ or exc)) from exc
        except openai.OpenAIError as exc:
            # Response validation, missing credentials and other client-side failures: a retry
            # would fail the same way.
            raise ProviderError(f"{self.name}: {exc}", provider=self.name, retryable=False) from exc
        return self.parse_completion(completion)

    @property
    def client(self) -> openai.AsyncOpenAI:
        """The SDK client (for `with_options` tweaks; closed by `aclose` only if this provider made it)."""
        return self._client

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.close()

    def build_kwargs(self, request: LlmRequest) -> dict[str, Any]:
        """The keyword arguments for `chat.completions.create` (public so tests can inspect them)."""
        messages = [_message_param(m) for m in request.messages]
        kwargs: dict[str, Any] = {"model": request.model, "messages": messages}
        if request.response_format == "json":
            kwargs["response_format"] = {"type": "json_object"}
            if not mentions_json(request.messages):
                messages.insert(0, {"role": "system", "content": JSON_INSTRUCTION})
        if request.tools:
            kwargs["tools"] = [_tool_param(t) for t in request.tools]
            kwargs["parallel_tool_calls"] = request.parallel_tool_calls
        if request.temperature is not None:
            kwargs["temperature"] = request.temperature
        if request.max_tokens is not None:
            kwargs[self._max_tokens_field] = request.max_tokens
        if request.timeout_s is not None:
            kwargs["timeout"] = request.timeout_s
        return kwargs

    def parse_completion(self, completion: ChatCompletion) -> LlmResponse:
        if not completion.choices:
            raise ProviderError(f"{self.name} returned no choices", provider=self.name, retryable=True)
        choice = completion.choices[0]
        calls: list[ToolCall] = []
        for call in choice.message.tool_calls or ():
            if call.type == "function":
                calls.append(ToolCall(id=call.id, name=call.function.name, arguments=call.function.arguments))
            else:  # custom (free-text) tools: the input is already the raw string
                calls.append(ToolCall(id=call.id, name=call.custom.name, arguments=call.custom.input))
        return LlmResponse(
            text=choice.message.content,
            tool_calls=calls,
            usage=_usage(completion),
            model=completion.model,
            finish_reason=str(choice.finish_reason or ("tool_calls" if calls else "stop")),
            response_id=completion.id,
            provider=self.name,
        )


def _tool_param(tool: ToolSpec) -> dict[str, Any]:
    parameters = tool.parameters or {"type": "object", "properties": {}}
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": parameters},
    }


def _message_param(message: Message) -> dict[str, Any]:
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id or "", "content": message.content or ""}
    if message.role == "assistant":
        out: dict[str, Any] = {"role": "assistant", "content": message.content}
        if message.tool_calls:
            out["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in message.tool_calls
            ]
        elif message.content is None:
            out["content"] = ""
        return out
    return {"role": message.role, "content": message.content or ""}


def _usage(completion: ChatCompletion) -> Usage:
    usage = completion.usage
    if usage is None:  # some compatible servers omit it
        return Usage()
    prompt_details = usage.prompt_tokens_details
    completion_details = usage.completion_tokens_details
    return Usage(
        input_tokens=usage.prompt_tokens,
        output_tokens=usage.completion_tokens,
        cache_read_tokens=(prompt_details.cached_tokens or 0) if prompt_details else 0,
        cache_write_tokens=(prompt_details.cache_write_tokens or 0) if prompt_details else 0,
        reasoning_tokens=(completion_details.reasoning_tokens or 0) if completion_details else 0,
    )
