"""Run one tool call the model asked for and turn every outcome into a tool message.

A tool call never raises into the step (docs/tool-calling.md): an unknown tool, bad arguments, a handler
exception, a timeout or an oversize result all become a failed `ToolOutcome` whose
`result_text` is `{"error": ...}`, so the model can recover. Only cancellation propagates.
This runs once per tool call per round, so schemas are compiled and signatures inspected
ahead of time (see `registry.py` and `schema.compiled_schema`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import enum
import inspect
import json
import re
import time
from dataclasses import dataclass
from typing import Any, Literal

import pydantic
from jsonschema.exceptions import SchemaError
from jsonschema.protocols import Validator

from stevora.attachments import (
    Attachment,
    AttachmentError,
    File,
    HasAttachments,
    Image,
    with_attachment_blocks,
)
from stevora.storable import encoded_size, problem_in_dumped, problem_in_value
from stevora.tools.registry import ToolArgumentError, ToolContext, ToolRegistry
from stevora.tools.schema import compiled_schema, json_path

try:  # a server dependency: the client-only install parses with the stdlib alone
    import orjson as _orjson
except ImportError:  # pragma: no cover - the test environment has the server extras
    _orjson = None  # type: ignore[assignment]

# The default of STEVORA_MAX_JSON_DEPTH, for callers that do not pass theirs.
DEFAULT_MAX_JSON_DEPTH = 64

ToolErrorCode = Literal[
    "TOOL_NOT_REGISTERED",
    # the model named a tool its step does not offer: refused, never looked up or run
    "TOOL_NOT_OFFERED",
    "INVALID_ARGUMENTS",
    "TOOL_ERROR",
    "TOOL_TIMEOUT",
    "TOOL_OUTPUT_TOO_LARGE",
    # an MCP server that cannot be reached, died during the call or is being restarted (docs/mcp.md)
    "MCP_SERVER_UNAVAILABLE",
    # calls answered from outside the loop (stevora.engine.steps.awaited)
    "TOOL_OUTPUT_TIMEOUT",
    "WORKFLOW_NOT_FOUND",
    "WORKFLOW_DEPTH_EXCEEDED",
    "WORKFLOW_RECURSION",
    # a replay with recorded tools: the origin has no recorded result for this call
    "TOOL_CALL_NOT_RECORDED",
    "CHILD_RUN_FAILED",
    "CHILD_RUN_CANCELLED",
    "TOOL_OUTPUT_INVALID",
    "APPROVAL_REJECTED",
    "STATE_TOO_LARGE",
]
_MAX_PROBLEM_CHARS = 300
# Arguments nested deeper are treated like unparseable ones (`{"raw": ...}`): their trace is stored
# and read back as the string the model wrote (JSON encoders and serialisers stop at 255 levels).
MAX_ARGUMENT_DEPTH = 64
_UNSTORABLE_CHARS = re.compile("[\x00\ud800-\udfff]")
# In the model's JSON text: an escape that decodes to NUL or to a surrogate.
_ESCAPED_UNSTORABLE = re.compile(r"\\u(?:0000|[dD][89a-fA-F])")
# A run of 19 digits: maybe an integer beyond 64 bits, which orjson would read as a float. Found
# in the text's UTF-8 with every ASCII digit made a 9 (no other byte of UTF-8 is one): one C
# search, ~6 times faster than the regex `[0-9]{19}` scanning every position of a stream's events.
_DIGITS_AS_NINES = bytes.maketrans(b"0123456789", b"9999999999")
_LONG_DIGITS_RUN = b"9" * 19


def has_long_digits(text: str | bytes) -> bool:
    """Whether `text` holds a run of 19 ASCII digits (`re.search("[0-9]{19}", text)`)."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    return _LONG_DIGITS_RUN in data.translate(_DIGITS_AS_NINES)


@dataclass(frozen=True)
class ToolOutcome:
    """What a tool call did: the trace row's fields plus the text the model gets back."""

    status: Literal["completed", "failed"]
    input: dict[str, Any]
    output: Any
    error: str | None
    error_code: ToolErrorCode | None
    duration_ms: float
    result_text: str
    attachments: tuple[Attachment, ...] = ()
    """Images and files the handler returned (`stevora.Image`, `stevora.File`); the output names
    them by hash and the engine stores their bytes once."""

    @property
    def ok(self) -> bool:
        return self.status == "completed"


@dataclass(frozen=True, slots=True)
class OutputLimits:
    """What a tool's result may be: at most `max_output_bytes` of JSON nested at most
    `max_json_depth` deep, and an `update_state` that keeps the run's state within
    `max_state_bytes` (None: not checked)."""

    max_output_bytes: int
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH
    max_state_bytes: int | None = None
    max_attachment_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class DeclaredSchemas:
    """A step's own schemas for a tool (an inline tool's `parameters` and `outputSchema`): each
    takes precedence over the registered tool's."""

    arguments: dict[str, Any] | None = None
    output: dict[str, Any] | None = None


NOT_DECLARED = DeclaredSchemas()


async def invoke_tool(
    registry: ToolRegistry,
    name: str,
    raw_arguments: str | dict[str, Any],
    *,
    context: ToolContext,
    timeout_s: float | None,
    limits: OutputLimits,
    declared: DeclaredSchemas = NOT_DECLARED,
) -> ToolOutcome:
    """Parse, validate and run one tool call; never raises except `CancelledError`.

    The registered tool's `timeout_ms`, when set, overrides `timeout_s`. An output the run
    cannot store exactly (docs/security.md) is `TOOL_OUTPUT_INVALID`; `update_state` calls that
    would grow the run's state (`context.state`) past `limits.max_state_bytes` are `STATE_TOO_LARGE`.
    """
    started = time.perf_counter()
    arguments, is_object = parse_arguments(raw_arguments)

    def failed(code: ToolErrorCode, error: str, model_message: str | None = None) -> ToolOutcome:
        return ToolOutcome(
            status="failed",
            input=arguments,
            output=None,
            error=error,
            error_code=code,
            duration_ms=(time.perf_counter() - started) * 1000,
            result_text=json.dumps({"error": model_message if model_message is not None else error}),
        )

    tool = registry.get(name)
    if tool is None:
        return failed("TOOL_NOT_REGISTERED", f"Tool '{name}' not registered")

    # Unparseable or non-object arguments reach the handler as {"raw": ...}, unvalidated.
    if is_object:
        try:
            schema = declared.arguments if declared.arguments is not None else tool.parameters
            validator, quick = compiled_schema(schema)
        except SchemaError as exc:
            return failed("TOOL_ERROR", f"Tool '{name}' has an invalid parameters schema: {exc.message}")
        # The quick check answers "certainly valid" for most calls; the validator words the errors.
        if quick is None or not quick(arguments):
            problems = _schema_problems(validator, arguments)
            if problems:
                return failed(
                    "INVALID_ARGUMENTS", f"Invalid arguments for tool '{name}': {'; '.join(problems)}"
                )

    assert tool.bind is not None  # set by RegisteredTool.__post_init__
    try:
        args, kwargs = tool.bind(arguments, context)
    except ToolArgumentError as exc:
        return failed("INVALID_ARGUMENTS", f"Invalid arguments for tool '{name}': {exc}")

    timeout = tool.timeout_ms / 1000 if tool.timeout_ms is not None else timeout_s
    scope = None
    try:
        running = tool.handler(*args, **kwargs) if tool.is_async else _in_thread(tool, args, kwargs)
        if timeout is None:  # no timeout configured: nothing to enter
            result = await running
        else:
            scope = asyncio.timeout(timeout)
            async with scope:
                result = await running
    except TimeoutError as exc:
        if scope is not None and scope.expired():
            _log_failure(name, context, "TOOL_TIMEOUT", None)
            return failed("TOOL_TIMEOUT", f"Tool '{name}' timed out after {timeout:g}s")
        _log_failure(name, context, "TOOL_ERROR", exc)
        return failed("TOOL_ERROR", _describe(exc), str(exc) or type(exc).__name__)
    except Exception as exc:
        # The traceback goes to the logs only: the model gets the message, never the stack.
        _log_failure(name, context, "TOOL_ERROR", exc)
        return failed("TOOL_ERROR", _describe(exc), str(exc) or type(exc).__name__)
    duration_ms = (time.perf_counter() - started) * 1000

    attachments: tuple[Attachment, ...] = ()
    if isinstance(result, str):
        text, output = result, result
    else:
        try:
            try:
                text = _RESULT_ENCODER.encode(result)
            except HasAttachments:  # rare: walk the result once more, naming each by its hash
                result, attachments = with_attachment_blocks(result, max_bytes=limits.max_attachment_bytes)
                text = _RESULT_ENCODER.encode(result)
        except AttachmentError as exc:
            code: ToolErrorCode = "TOOL_OUTPUT_TOO_LARGE" if "limit" in str(exc) else "TOOL_OUTPUT_INVALID"
            return failed(code, f"Output of tool '{name}' has an attachment that cannot be used: {exc}")
        except (TypeError, ValueError, RecursionError) as exc:
            return failed("TOOL_ERROR", f"Tool output is not JSON-serialisable: {exc}")
        # The output as its JSON reads back (tuples as lists, models as objects, a copy the
        # handler cannot change later): what the trace stores and a resumed run sees.
        output = loads_json(text)
    max_output_bytes = limits.max_output_bytes
    unstorable = problem_in_dumped(output, text, max_depth=limits.max_json_depth, root="output")
    if unstorable is not None:
        return failed(
            "TOOL_OUTPUT_INVALID",
            f"Output of tool '{name}' cannot be stored: {unstorable.path}: {unstorable.message}",
        )
    # A character is at most 4 UTF-8 bytes, so short text skips the encode.
    if len(text) * 4 > max_output_bytes:
        size = len(text.encode("utf-8"))
        if size > max_output_bytes:
            limit = f"Tool output is {size} bytes, over the {max_output_bytes}-byte limit"
            return failed("TOOL_OUTPUT_TOO_LARGE", limit)
    output_schema = declared.output if declared.output is not None else tool.output_schema
    if output_schema is not None:
        problems = schema_problems(output_schema, output)
        if problems:
            return failed(
                "TOOL_OUTPUT_INVALID",
                f"Output of tool '{name}' does not match its output schema: {'; '.join(problems)}",
            )
    updates = context.state_updates
    if updates:
        problem = problem_in_value(updates, max_depth=limits.max_json_depth, root="state")
        if problem is not None:
            return failed(
                "TOOL_OUTPUT_INVALID",
                f"update_state of tool '{name}' cannot be stored: {problem.path}: {problem.message}",
            )
        max_state_bytes = limits.max_state_bytes
        if max_state_bytes is not None:
            size = encoded_size({**context.state, **updates})
            if size > max_state_bytes:
                return failed(
                    "STATE_TOO_LARGE",
                    f"update_state of tool '{name}' would make the run's state {size} bytes, over the "
                    f"{max_state_bytes}-byte limit; nothing was merged",
                )
    return ToolOutcome(
        status="completed",
        input=arguments,
        output=output,
        error=None,
        error_code=None,
        duration_ms=duration_ms,
        result_text=text,
        attachments=attachments,
    )


async def _in_thread(tool: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    result = await asyncio.to_thread(tool.handler, *args, **kwargs)
    if inspect.isawaitable(result):  # a plain function that returned a coroutine
        result = await result
    return result


def loads_json(text: str | bytes) -> Any:
    """`json.loads(text)`, by orjson when it reads the text the same way: not with a run of 19
    digits (orjson reads integers beyond 64 bits as floats) and not with what it refuses
    (NaN, Infinity, numbers beyond a double, lone surrogates; bytes that are not UTF-8, such
    as UTF-16 or a byte-order mark, which the stdlib detects), which the stdlib reads."""
    if _orjson is not None and not has_long_digits(text):
        try:
            return _orjson.loads(text)
        except _orjson.JSONDecodeError:
            pass
    return json.loads(text)


def _log_failure(name: str, context: ToolContext, code: ToolErrorCode, exc: BaseException | None) -> None:
    # Imported and looked up per failure: the current structlog configuration applies, and the
    # client-only install (which has no structlog) can still import this module.
    import structlog

    structlog.get_logger("stevora.tools").warning(
        "tool_call_failed",
        tool_name=name,
        error_code=code,
        idempotency_key=context.idempotency_key,
        workflow_run_id=context.workflow_run_id,
        step_name=context.step_name,
        exc_info=exc if exc is not None else False,
    )


def parse_arguments(raw: str | dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """`(arguments, is_object)`; anything but a JSON object becomes `{"raw": raw}`."""
    if isinstance(raw, dict):
        return raw, True
    if not raw.strip():
        return {}, True
    try:
        parsed = loads_json(raw)
    except (ValueError, RecursionError):  # RecursionError: nested past the parser's recursion limit
        return {"raw": raw}, False
    if not isinstance(parsed, dict):
        return {"raw": raw}, False
    # Fewer brackets than the limit (strings' included) cannot nest deeper: no walk.
    if raw.count("[") + raw.count("{") > MAX_ARGUMENT_DEPTH and deeper_than(parsed, MAX_ARGUMENT_DEPTH):
        return {"raw": raw}, False
    if "\\u" in raw and _ESCAPED_UNSTORABLE.search(raw):
        parsed = without_unstorable_chars(parsed)
    return parsed, True


def without_unstorable_chars(value: Any) -> Any:
    """`value` with NUL and lone surrogates in its strings and keys replaced by U+FFFD, as the
    database keeps them, so a handler sees what its trace shows (for values ≤ 64 levels deep)."""
    if isinstance(value, str):
        return _UNSTORABLE_CHARS.sub("\ufffd", value)
    if isinstance(value, dict):
        return {without_unstorable_chars(k): without_unstorable_chars(v) for k, v in value.items()}
    if isinstance(value, list):
        return [without_unstorable_chars(item) for item in value]
    return value


def deeper_than(value: Any, limit: int) -> bool:
    """Whether `value` nests more than `limit` containers deep (iterative: any depth is safe)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def _schema_problems(validator: Validator, instance: Any) -> list[str]:
    """One `path: message` per bad field, sorted by path, so the model can fix them all at once."""
    found: list[tuple[str, str]] = []
    for error in validator.iter_errors(instance):
        path: list[str | int] = list(error.absolute_path)
        if error.validator == "required":
            # jsonschema reports one error per missing property but names it only in the message.
            missing = [p for p in error.validator_value if error.message == f"{p!r} is a required property"]
            found.append((json_path([*path, *missing[:1]]), error.message))
        elif error.validator == "additionalProperties" and isinstance(error.instance, dict):
            for extra in _unexpected_keys(error.schema, error.instance):
                found.append((json_path([*path, extra]), f"{extra!r} is not an allowed property"))
        else:
            found.append((json_path(path), error.message))
    found.sort(key=lambda item: item[0])
    problems = (f"{p}: {m}" if p else m for p, m in found)
    return list(dict.fromkeys(_clip(p) for p in problems))


def _unexpected_keys(schema: Any, instance: dict[str, Any]) -> list[str]:
    if not isinstance(schema, dict):
        return []
    known = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    return [k for k in instance if k not in known and not any(re.search(p, k) for p in patterns)]


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_PROBLEM_CHARS else text[: _MAX_PROBLEM_CHARS - 1] + "…"


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _to_json(value: Any) -> Any:
    """`json.dumps` fallback: pydantic models, dataclasses, enums, dates, sets; else `str()`."""
    if isinstance(value, Image | File):
        raise HasAttachments
    if isinstance(value, pydantic.BaseModel):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    return str(value)


# `json.dumps(result, default=_to_json, ensure_ascii=False, allow_nan=False)`, built once.
_RESULT_ENCODER = json.JSONEncoder(default=_to_json, ensure_ascii=False, allow_nan=False)


def schema_problems(schema: dict[str, Any], instance: Any) -> list[str]:
    """`path: message` for every way `instance` breaks `schema` (empty when it is valid)."""
    validator, quick = compiled_schema(schema)
    if quick is not None and quick(instance):
        return []
    return _schema_problems(validator, instance)


_FIELD_PATH = re.compile(r"[A-Za-z_$][\w$-]*(\[\d+\]|\.[A-Za-z_$][\w$-]*)*")


def field_problem(problem: str, field: str = "input") -> dict[str, str]:
    """`"customer.id: 1 is not of type 'string'"` → `{"path": "input.customer.id", "message": ...}`
    (`field` names the request field the checked object came in)."""
    path, sep, message = problem.partition(": ")
    if sep and _FIELD_PATH.fullmatch(path):
        return {"path": f"{field}.{path}", "message": message}
    return {"path": field, "message": problem}


def with_defaults(schema: dict[str, Any], arguments: dict[str, Any]) -> dict[str, Any]:
    """`arguments` plus the `default` of every top-level property it leaves out."""
    filled = dict(arguments)
    for name, prop in (schema.get("properties") or {}).items():
        if name not in filled and isinstance(prop, dict) and "default" in prop:
            filled[name] = prop["default"]
    return filled
