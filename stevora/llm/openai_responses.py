"""OpenAI's Responses API (`client.responses.create`): the request and answer mapping, stateless.

Stevora keeps the conversation itself, so every call is `store: false` with the whole transcript
as `input` items, and asks for `include: ["reasoning.encrypted_content"]`: a reasoning model's
`reasoning` items come back encrypted, are checkpointed with their round (`ReasoningItem`, kind
`openai_responses`) and are sent again, unchanged and before that round's `function_call` items,
on every later round, so the model keeps its chain of thought across tool rounds, after a crash,
in a fork and in a replay (docs/providers.md, "api: responses").

`OpenAIProvider` calls this for a request whose `api` is `responses` (or whose provider defaults
to it, docs/configuration.md); errors are translated there, as for Chat Completions.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any, cast

import httpx2
import openai
from openai._models import FinalRequestOptions, SecurityOptions
from openai.types.responses import Response, ResponseReasoningItem

from stevora.errors import ProviderError
from stevora.llm.messages import (
    LlmRequest,
    LlmResponse,
    Message,
    NamedTool,
    Part,
    ReasoningItem,
    ToolCall,
    ToolSpec,
    Usage,
)
from stevora.llm.provider import (
    JSON_INSTRUCTION,
    MALFORMED,
    checked_response,
    data_url,
    made_once,
    malformed_answer,
    mentions_json,
)
from stevora.llm.streaming import BROKEN_STREAM, StreamAccumulator
from stevora.llm.structured import STRUCTURED_NAME, StructuredPlan
from stevora.llm.wire_json import body_json
from stevora.tools.invoke import loads_json

# A stream that broke after its 200 (`StreamAccumulator.broken`).
_BROKEN: tuple[type[Exception], ...] = (openai.OpenAIError, *BROKEN_STREAM)

INCLUDE = ["reasoning.encrypted_content"]

# `incomplete_details.reason` in the provider-neutral words of `LlmResponse.finish_reason`.
_INCOMPLETE: dict[str, str] = {"max_output_tokens": "length", "content_filter": "content_filter"}


def build_kwargs(request: LlmRequest, plan: StructuredPlan | None = None) -> dict[str, Any]:
    """The keyword arguments for `responses.create` (public so tests can inspect them).

    `plan` (`OpenAIProvider.structured_plan`) says how the request's `output_schema` is held:
    `native` is `text.format` as a strict `json_schema`; `tool` is already in `plan.request` (the
    final-answer function, forced); `prompt` is a system item saying the schema."""
    if plan is not None:
        request = plan.request
    items = input_items(request.messages)
    kwargs: dict[str, Any] = {"model": request.model, "input": items, "store": False, "include": INCLUDE}
    if plan is not None and plan.native_schema is not None:
        kwargs["text"] = {
            "format": {
                "type": "json_schema",
                "name": STRUCTURED_NAME,
                "schema": plan.native_schema,
                "strict": True,
            }
        }
    elif plan is not None and plan.instruction is not None:
        items.insert(0, {"role": "system", "content": plan.instruction})
        if request.response_format == "json":
            kwargs["text"] = {"format": {"type": "json_object"}}
    elif request.response_format == "json":
        kwargs["text"] = {"format": {"type": "json_object"}}
        if not mentions_json(request.messages):
            items.insert(0, {"role": "system", "content": JSON_INSTRUCTION})
    if request.tools:
        kwargs["tools"] = [tool_param(t) for t in request.tools]
        kwargs["parallel_tool_calls"] = request.parallel_tool_calls
        choice = request.tool_choice
        if isinstance(choice, NamedTool):
            kwargs["tool_choice"] = {"type": "function", "name": choice.name}
        elif choice != "auto":  # `required`, `none`: the API takes both as they are
            kwargs["tool_choice"] = choice
    if request.reasoning_effort is not None:
        kwargs["reasoning"] = {"effort": request.reasoning_effort}
    if request.temperature is not None:
        kwargs["temperature"] = request.temperature
    if request.max_tokens is not None:
        kwargs["max_output_tokens"] = request.max_tokens
    if request.timeout_s is not None:
        kwargs["timeout"] = request.timeout_s
    if request.cache_key is not None:
        kwargs["prompt_cache_key"] = request.cache_key
    return kwargs


def input_items(messages: list[Message]) -> list[dict[str, Any]]:
    """The transcript as Responses `input` items: an assistant turn is its reasoning items (as the
    API wrote them), its text, then one `function_call` per tool call; a tool result is a
    `function_call_output`, whose `output` is a list of input parts when the tool returned images
    or files (the API takes `input_text`, `input_image` and `input_file` there)."""
    items: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "tool":
            output: str | list[dict[str, Any]] = message.content or ""
            if message.attachments:
                text = [{"type": "input_text", "text": message.content}] if message.content else []
                output = text + [content_part(p) for p in message.attachments]
            items.append(
                {"type": "function_call_output", "call_id": message.tool_call_id or "", "output": output}
            )
        elif message.role == "assistant":
            items += [item for r in message.reasoning if r.kind == "openai_responses" and (item := r.item())]
            ids = next((r.item() for r in message.reasoning if r.kind == "openai_item_ids"), {})
            kept = ids.get("calls")
            calls: dict[str, Any] = kept if isinstance(kept, dict) else {}
            if message.content:
                items.append(_assistant_text(message.content, ids.get("message")))
            items += [_function_call(c, calls.get(c.id)) for c in message.tool_calls]
        elif message.parts:
            items.append({"role": message.role, "content": [content_part(p) for p in message.parts]})
        else:
            items.append({"role": message.role, "content": message.content or ""})
    return items


def content_part(part: Part) -> dict[str, Any]:
    """One content part in the Responses API's words: `input_text`, `input_image` (an http(s) URL
    or a base64 data URL; `detail` is required in a message) and `input_file` (a PDF as a data URL)."""
    if part.type == "text":
        return {"type": "input_text", "text": part.text or ""}
    if part.type == "image":
        return {"type": "input_image", "detail": "auto", "image_url": part.url or data_url(part)}
    filename = f"{(part.sha256 or 'file')[:16]}.pdf"
    return {"type": "input_file", "filename": filename, "file_data": data_url(part)}


def _assistant_text(text: str, item_id: object) -> dict[str, Any]:
    """An assistant turn's text: the output message it was (with its id), else a plain message."""
    if not isinstance(item_id, str):
        return {"role": "assistant", "content": text}
    content = [{"type": "output_text", "text": text, "annotations": []}]
    return {"type": "message", "id": item_id, "role": "assistant", "status": "completed", "content": content}


def _function_call(call: ToolCall, item_id: object) -> dict[str, Any]:
    """A tool call as its `function_call` item; with the id the API gave it, when kept (a reasoning
    item goes back with the items that followed it, as they were)."""
    item: dict[str, Any] = {"type": "function_call"}
    if isinstance(item_id, str):
        item["id"] = item_id
    item.update(call_id=call.id, name=call.name, arguments=call.arguments)
    return item


def tool_param(tool: ToolSpec) -> dict[str, Any]:
    """A function tool, `strict` where its schema is one strict mode takes as it is."""
    parameters = tool.parameters or {"type": "object", "properties": {}, "additionalProperties": False}
    return {
        "type": "function",
        "name": tool.name,
        "description": tool.description,
        "parameters": parameters,
        "strict": strict_allowed(parameters),
    }


def strict_allowed(schema: object) -> bool:
    """Whether OpenAI's strict mode takes `schema` unchanged: every object (nested ones too) lists
    all its properties in `required` and has `additionalProperties: false`, and no `oneOf`.
    Anything else is sent with `strict: false` rather than rewritten (a rewrite would change what
    the tool accepts)."""
    if not isinstance(schema, Mapping):
        return True
    if "oneOf" in schema:
        return False
    properties = schema.get("properties")
    if schema.get("type") == "object" or properties is not None:
        if not isinstance(properties, Mapping | None) or schema.get("additionalProperties") is not False:
            return False
        properties = properties or {}
        if set(schema.get("required") or ()) != set(properties):
            return False
        if not all(strict_allowed(p) for p in properties.values()):
            return False
    for key in ("items", "anyOf", "allOf", "prefixItems", "$defs", "definitions"):
        sub = schema.get(key)
        subs = sub.values() if isinstance(sub, Mapping) and key in ("$defs", "definitions") else sub
        if not all(
            strict_allowed(s) for s in (subs if isinstance(subs, list | type({}.values())) else [subs])
        ):
            return False
    return True


def parse_response(response: dict[str, Any], provider: str) -> LlmResponse:
    """A Responses answer (its JSON object) as an `LlmResponse`; its reasoning items kept whole,
    in output order. Read as the SDK's unvalidated `Response` was (a field it lacks reads as
    `None`, an item of another type is skipped); types are the caller's to check
    (`checked_response`)."""
    texts: list[str] = []
    calls: list[ToolCall] = []
    reasoning: list[ReasoningItem] = []
    ids: dict[str, Any] = {}
    output: Any = response.get("output")
    for item in output:
        kind = item.get("type")
        if kind == "reasoning":
            # As the SDK's model dumps it (its field order, `None`s dropped): the stored text is
            # the one a round has always stored, so a resumed round sends the same bytes.
            dumped = ResponseReasoningItem.construct(**item).model_dump(mode="json", exclude_none=True)
            reasoning.append(ReasoningItem.of("openai_responses", dumped))
        elif kind == "function_call":
            call_id = item.get("call_id")
            calls.append(ToolCall(call_id, item.get("name"), item.get("arguments")))
            if item.get("id"):
                ids.setdefault("calls", {})[call_id] = item["id"]
        elif kind == "message":
            texts += [part.get("text") for part in item.get("content") if part.get("type") == "output_text"]
            ids.setdefault("message", item.get("id"))
    if reasoning and ids:  # only a turn with reasoning needs its items' ids back
        reasoning.append(ReasoningItem.of("openai_item_ids", ids))
    status = response.get("status")
    if status == "failed":
        error = response.get("error")
        detail = error.get("message") if error is not None else "no detail"
        raise ProviderError(f"{provider} response failed: {detail}", provider=provider, retryable=True)
    finish = "tool_calls" if calls else "stop"
    details = response.get("incomplete_details")
    model: Any = response.get("model")  # a string, or `checked_response` says what it is
    if status == "incomplete" and details is not None:
        finish = _INCOMPLETE.get(str(details.get("reason")), "length")
    return LlmResponse(
        text="".join(texts) if texts else None,
        tool_calls=calls,
        usage=usage_of(response.get("usage")),
        model=model,
        finish_reason=finish,
        response_id=response.get("id"),
        provider=provider,
        reasoning=reasoning,
    )


def usage_of(usage: Any) -> Usage:
    """The answer's JSON `usage`; a details object counts as present whatever it holds, as the
    SDK's model of it did."""
    if usage is None:
        return Usage()
    inputs, outputs = usage.get("input_tokens_details"), usage.get("output_tokens_details")
    return Usage(
        input_tokens=usage.get("input_tokens"),
        output_tokens=usage.get("output_tokens"),
        cache_read_tokens=inputs.get("cached_tokens") if _given(inputs) else 0,
        reasoning_tokens=outputs.get("reasoning_tokens") if _given(outputs) else 0,
    )


def _given(details: object) -> bool:
    return isinstance(details, dict) or bool(details)


# `create`'s arguments that are request options, not body.
_REQUEST_OPTIONS = frozenset({"timeout", "extra_headers", "extra_query", "extra_body"})


def _security() -> SecurityOptions:
    """The credentials `create` asks for (its `make_request_options(security=...)`): the API key
    alone, not the admin key the SDK's default would fall back to."""
    return {"bearer_auth": True}


async def post(
    client: openai.AsyncOpenAI, path: str, kwargs: dict[str, Any], *, stream: bool
) -> httpx2.Response:
    """POST `path` through the SDK (its headers, retries, timeouts and error types) with the JSON
    `create(**kwargs, stream=stream)` sends, key for key, but without `create`: it walks its
    arguments against the SDK's TypedDicts on every call (the transcript too, unless it goes as
    `extra_body`; its own arguments even then, hashing `Literal` types) and wraps or builds the
    answer's model: ~840 of a plain call's ~3,600 Python calls (docs/benchmarks.md). The
    adapters' dicts are the wire form already and they read the answer as JSON. The request
    options `create` would build are copied from ones built once (`_request_options`).
    Streamed: the answer's body still unread (the caller closes it)."""
    body: dict[str, Any] = {"model": kwargs["model"]}
    if stream:
        body["stream"] = True
    for key, value in kwargs.items():
        if key not in _REQUEST_OPTIONS:
            body.setdefault(key, value)
    body.update(kwargs.get("extra_body") or {})
    # As `content` bytes, which the SDK sends as they are: the JSON its `openapi_dumps` writes for
    # the dict, each kept message encoded once (`wire_json.body_json`). Not to a client that
    # builds its requests its own way (Azure's reads the body's model for the URL): the dict.
    sent: dict[str, Any] = {"body": body}
    if _builds_as_the_sdk(type(client)):
        try:
            sent = {"content": body_json(body, "messages")}
        except (TypeError, ValueError):  # not plain JSON: the SDK's encoder (and its errors) as before
            pass
    timeout = kwargs.get("timeout", openai.NOT_GIVEN)
    extra = kwargs.get("extra_headers") or kwargs.get("extra_query")
    prepared = None if extra else _request_options(client, path, timeout, sent)
    if prepared is None:  # options the kept ones are not keyed by: `post` builds them
        options: dict[str, Any] = {"security": _security()}
        if "timeout" in kwargs:
            options["timeout"] = kwargs["timeout"]
        if kwargs.get("extra_headers"):
            options["headers"] = kwargs["extra_headers"]
        if kwargs.get("extra_query"):
            options["params"] = kwargs["extra_query"]
        answer: httpx2.Response = await client.post(
            path, cast_to=httpx2.Response, options=cast(Any, options), stream=stream, stream_cls=None, **sent
        )
        return answer
    # What `post` does with the options it builds.
    answer = await client.request(httpx2.Response, prepared, stream=stream, stream_cls=None)
    return answer


def _builds_as_the_sdk(cls: type) -> bool:
    """Whether `cls` builds a request as `openai.AsyncOpenAI` does (no `_build_request` of its
    own, as `AsyncAzureOpenAI` has): then the body may go as `content` bytes."""
    found = _BUILDS_AS_THE_SDK.get(cls)
    if found is None:
        found = _BUILDS_AS_THE_SDK[cls] = (
            getattr(cls, "_build_request", None) is openai.AsyncOpenAI._build_request
        )
    return found


_BUILDS_AS_THE_SDK: dict[type, bool] = {}


def _request_options(
    client: Any, path: str, timeout: Any, sent: dict[str, Any]
) -> FinalRequestOptions | None:
    """The options `client.post(path, cast_to=httpx2.Response, **sent, options=...)` (`sent`: the
    body as `content` bytes, or as the `body` dict) gives
    `client.request` (`options`: `create`'s security and the timeout, if any), without building
    them afresh (~200 Python calls: pydantic's `model_construct` resolves and deep-copies the
    default of each of 20 fields): built once per path and timeout by the SDK's own
    `FinalRequestOptions.construct`, as `post` builds them, and copied with this call's body, as
    Anthropic's (`anthropic_provider._request_options`; the SDK copies the options again before
    it changes any). `None` for a timeout that is not a number (`post` then builds them)."""
    if timeout is not openai.NOT_GIVEN and type(timeout) not in (float, int):
        return None
    given = {} if timeout is openai.NOT_GIVEN else {"timeout": timeout}
    template = made_once(
        client,
        "_stevora_options",
        (path, type(timeout), timeout),  # 30 and 30.0 are sent apart (`x-stainless-read-timeout`)
        lambda: FinalRequestOptions.construct(
            method="post", url=path, json_data=None, content=None, files=None, security=_security(), **given
        ),
    )
    if "body" in sent:
        return template.model_copy(update={"json_data": sent["body"]})
    return template.model_copy(update={"content": sent["content"]})


async def complete(
    client: openai.AsyncOpenAI,
    provider: str,
    kwargs: dict[str, Any],
    request: LlmRequest,
    *,
    stream: bool,
    by: float | None = None,
) -> LlmResponse:
    """One call, streamed or not (`kwargs` as for `create`), sent and read by `by`
    (`provider.deadline`: its `TimeoutError` is the caller's to translate, as are SDK errors)."""
    if not stream:
        async with asyncio.timeout_at(by):
            raw = await post(client, "/responses", kwargs, stream=False)
        try:
            answer = loads_json(raw.content)
            if not isinstance(answer, dict):
                raise TypeError(f"the answer is {type(answer).__name__}, not an object")
            if getattr(client, "_strict_response_validation", False):
                Response.model_validate(answer)  # as `create` would have (the tests' clients)
            return checked_response(parse_response(answer, provider))
        except MALFORMED as exc:
            raise malformed_answer(provider, "a Responses API response", exc) from exc
    # The SDK retries a stream until its 200; the events are read as JSON here (the SDK's stream
    # builds a model of every event): only the deltas the sink hears and the final answer are
    # read, the final one as a plain answer is.
    async with asyncio.timeout_at(by):
        raw = await post(client, "/responses", kwargs, stream=True)
    acc = StreamAccumulator(provider, request.sink)
    final: dict[str, Any] | None = None
    try:
        # The step's timeout bounds the whole answer, as on Chat Completions.
        async with asyncio.timeout_at(by):
            async for event in sse_chunks(raw):
                kind = event.get("type")
                if kind == "response.output_text.delta":
                    acc.text(event["delta"])
                elif kind == "response.output_item.added" and event["item"].get("type") == "function_call":
                    item = event["item"]
                    acc.tool_start(event["output_index"], item["call_id"], item["name"])
                elif kind in ("response.completed", "response.incomplete"):
                    if not isinstance(event["response"], dict):
                        raise TypeError("the final event's response is not an object")
                    final = event["response"]
                elif kind in ("response.failed", "error"):
                    raise acc.broken(event.get("message") or _failure(event.get("response")))
    except TimeoutError as exc:
        raise acc.broken(f"no complete answer within {request.timeout_s:g} s") from exc
    except _BROKEN as exc:
        # `data: {"error": ...}` after the 200, a dropped connection, a read timeout, an event
        # that is not a JSON object.
        raise acc.broken(str(exc) or type(exc).__name__) from exc
    finally:
        await raw.aclose()
    if final is None:
        raise acc.broken("the stream ended before its final event")
    # The final event carries the whole answer (reasoning items with their encrypted content
    # included): parsed as a plain answer is, so a streamed round stores the same items.
    try:
        return checked_response(parse_response(final, provider))
    except MALFORMED as exc:
        raise acc.broken(str(exc) or type(exc).__name__) from exc


async def sse_chunks(raw: httpx2.Response) -> AsyncIterator[dict[str, Any]]:
    """The JSON objects of a Chat Completions event stream, as the SDK's stream reads them: up to
    `data: [DONE]` (the body is still read to its end, so the connection is reused), and
    `data: {"error": ...}` raised as the SDK raises it (`openai.APIError`)."""
    data: list[str] = []
    done = False
    async for line in raw.aiter_lines():
        if line:
            if line.startswith("data:"):
                data.append(line[6:] if line.startswith("data: ") else line[5:])
            continue  # `event:`, `id:`, `retry:` and `:` comments: nothing Chat Completions uses
        if not data or done:
            data.clear()
            continue
        text = "\n".join(data)
        data.clear()
        if text.startswith("[DONE]"):
            done = True
            continue
        chunk = loads_json(text)
        if not isinstance(chunk, dict):
            raise ValueError(f"a stream chunk is not a JSON object: {text[:100]}")
        error = chunk.get("error")
        if error:
            message = error.get("message") if isinstance(error, dict) else None
            if not message or not isinstance(message, str):
                message = "An error occurred during streaming"
            raise openai.APIError(message, raw.request, body=error)
        yield chunk


def _failure(response: object) -> str:
    """What a `response.failed` event's response says went wrong."""
    error = response.get("error") if isinstance(response, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) and message else "the response failed"
