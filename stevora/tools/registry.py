"""Tool handlers by name: what the engine runs when a model asks for a tool.

Step definitions declare tools (name, description, JSON Schema) for the model; the registry
holds the handlers that run them. Everything about a handler's signature is worked out once
at registration into a `bind` function, so a call does no inspection.

Handlers are at-least-once (a crash between running a handler and committing its trace row
runs it again), while trace records are exactly-once. Handlers with side effects should
key them on `ToolContext.idempotency_key`.
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, Literal, TypeVar, overload

import pydantic
from jsonschema.exceptions import SchemaError

from stevora.tools.schema import (
    FunctionSpec,
    analyse_function,
    compiled_validator,
    is_context_annotation,
    json_path,
)
from stevora.tools.store import ToolStore

F = TypeVar("F", bound=Callable[..., Any])
Binder = Callable[[dict[str, Any], "ToolContext"], tuple[tuple[Any, ...], dict[str, Any]]]

_NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
_NO_KWARGS: dict[str, Any] = {}  # shared: `**` unpacking copies it, nothing mutates it
_ANY_OBJECT: dict[str, Any] = {"type": "object"}
_MAX_STEP_NAME = 100  # a step name's length limit (stevora.definitions.steps.StepBase.name)


@dataclass(frozen=True)
class ToolContext:
    """Who is calling a tool, and the run it acts on.

    `idempotency_key` is `<stepRunId>:<round>:<callIndex>` in an `llm` step and `<stepRunId>:tool`
    in a `tool` step. `run_input` is the run's input; `state` a read-only snapshot of its state.
    `update_state({...})` changes are merged (shallowly) into the run's state in the same
    transaction as the call's trace row, so a crash never applies them twice and a failed call
    (raised, timed out, or an output failing its schema) applies none.

    In an `llm` step, `goto("step")` ends the step after this round and continues the run at that
    step (recorded with the call's trace row, and like `update_state` only if the call completes),
    and `transcript` is the step's conversation up to the assistant message that made this call.
    """

    __stevora_tool_context__: ClassVar[bool] = True
    # Where `goto` sent the run: this class default until a handler calls it (then an instance
    # attribute), so a call that does not steer costs nothing.
    _goto_step: ClassVar[str | None] = None

    idempotency_key: str
    workflow_run_id: str
    workspace_id: str
    step_run_id: str
    step_name: str
    round: int
    call_index: int
    tool_call_id: str
    run_input: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    state: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    _state_updates: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    # Set by an llm step's tool loop, once per round and shared by its calls: the conversation
    # list (never copied unless `transcript` is read) and its length when the round's calls
    # started. Its presence allows `goto`, whose target is an attribute set only when called.
    _steering: tuple[Sequence[Any], int] | None = field(default=None, repr=False, compare=False)
    # The workspace's memory store as the engine reads it; `store` is built from it when first read.
    _store_backend: Any = field(default=None, repr=False, compare=False)
    _store: ClassVar[ToolStore | None] = None

    @property
    def log(self) -> Any:
        """A structlog logger bound to the run, step and call."""
        import structlog  # a server dependency: the client-only install has no structlog

        return structlog.get_logger("stevora.tools").bind(
            workflow_run_id=self.workflow_run_id,
            step_name=self.step_name,
            tool_call_id=self.tool_call_id,
            idempotency_key=self.idempotency_key,
        )

    def update_state(self, updates: Mapping[str, Any]) -> None:
        """Merge `updates` into the run's state when (and only if) this call is recorded as completed."""
        if not isinstance(updates, Mapping) or not all(isinstance(k, str) for k in updates):
            raise TypeError("update_state takes a mapping with string keys")
        self._state_updates.update(updates)

    @property
    def state_updates(self) -> dict[str, Any]:
        return dict(self._state_updates)

    def goto(self, step_name: str) -> None:
        """End the `llm` step after this round (the model is not called again) and continue the run
        at `step_name`. Takes effect only if this call completes; a second call replaces the first;
        of several calls in one round that go somewhere, the first in the model's order wins."""
        if self._steering is None:
            raise RuntimeError("ctx.goto is only available to tools called by an llm step's model")
        if not isinstance(step_name, str) or not 1 <= len(step_name) <= _MAX_STEP_NAME:
            raise ValueError(f"ctx.goto takes a step name (a string of 1-{_MAX_STEP_NAME} characters)")
        object.__setattr__(self, "_goto_step", step_name)

    @property
    def store(self) -> ToolStore:
        """The workspace's memory store (`await ctx.store.put/get/delete/search(...)`): writes land
        with this call's trace row, only if the call completes (docs/threads.md)."""
        if self._store is None:
            if self._store_backend is None:
                raise RuntimeError("ctx.store is only available to tools called by a run")
            object.__setattr__(self, "_store", ToolStore(self._store_backend))
        assert self._store is not None
        return self._store

    @property
    def store_writes(self) -> list[tuple[str, str, dict[str, Any] | None]]:
        """What the call wrote to the store (applied with its trace row)."""
        return self._store.writes if self._store is not None else []

    @property
    def goto_step(self) -> str | None:
        """The step this call went to with `goto`, if any."""
        return self._goto_step

    @property
    def transcript(self) -> tuple[Any, ...]:
        """The step's conversation so far (system and user prompt, assistant turns, tool results),
        up to and including the assistant message that made this call: a tuple of frozen
        `stevora.llm.Message`s, built when read. Empty outside an llm step."""
        if self._steering is None:
            return ()
        conversation, end = self._steering
        # `end` is the conversation's length when the call started: after the assistant message,
        # and after the results of this round's calls that a resumed step had already committed.
        while end > 0 and getattr(conversation[end - 1], "role", None) != "assistant":
            end -= 1
        return tuple(conversation[:end])


class ToolArgumentError(ValueError):
    """Arguments passed the JSON Schema but cannot be bound to the handler's parameters."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class RegisteredTool:
    """A handler plus what the invoker needs to call it.

    `call_style` "input" passes the argument object as one dict; "kwargs" (`@tool`) passes
    its fields as keyword arguments. `bind` turns validated arguments into `(args, kwargs)`.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    handler: Callable[..., Any]
    is_async: bool
    wants_context: bool
    call_style: Literal["input", "kwargs"]
    timeout_ms: int | None = None
    bind: Binder | None = field(default=None, repr=False, compare=False)
    output_schema: dict[str, Any] | None = None  # a result must match it (TOOL_OUTPUT_INVALID otherwise)
    is_global: bool = False  # offered to every llm step unless the step sets globalTools: false
    requires_approval: bool = False  # a person approves, edits or rejects each call before it runs

    def __post_init__(self) -> None:
        if self.bind is None:
            # Built by hand (tests, adapters): positional context for "input", `context=` for "kwargs".
            if self.call_style == "input":
                binder = _input_binder(positional_context=self.wants_context, context_keyword=None)
            else:
                binder = _plain_kwargs_binder("context" if self.wants_context else None)
            object.__setattr__(self, "bind", binder)

    def as_definition(self) -> dict[str, Any]:
        """The `{name, description, parameters}` tool definition a provider is sent."""
        return {"name": self.name, "description": self.description, "parameters": self.parameters}


class ToolRegistry:
    """Tool handlers by name. Pass one explicitly; `default_registry` is only the process edge."""

    def __init__(self) -> None:
        self._tools: dict[str, RegisteredTool] = {}

    def register(
        self,
        name: str,
        handler: Callable[..., Any],
        *,
        description: str | None = None,
        parameters: Mapping[str, Any] | None = None,
        timeout_ms: int | None = None,
        output_schema: Mapping[str, Any] | None = None,
        global_: bool = False,
        requires_approval: bool = False,
    ) -> RegisteredTool:
        """Register `handler(input)` or `handler(input, context)`; the same name replaces it."""
        _check_common(name, handler, timeout_ms)
        schema = dict(parameters) if parameters is not None else dict(_ANY_OBJECT)
        if schema.get("type", "object") != "object":
            raise ValueError(f"Tool {name!r}: parameters must be a JSON Schema of type 'object'")
        try:
            compiled_validator(schema)  # reject a bad schema now, and warm the cache
        except SchemaError as exc:
            raise ValueError(f"Tool {name!r}: invalid parameters schema: {exc.message}") from exc
        positional, keyword = _context_parameter(handler)
        registered = RegisteredTool(
            name=name,
            description=description if description is not None else _summary(handler),
            parameters=schema,
            handler=handler,
            is_async=_is_async(handler),
            wants_context=positional or keyword is not None,
            call_style="input",
            timeout_ms=timeout_ms,
            bind=_input_binder(positional_context=positional, context_keyword=keyword),
            output_schema=_checked_output_schema(name, output_schema),
            is_global=global_,
            requires_approval=requires_approval,
        )
        self._tools[name] = registered
        return registered

    @overload
    def tool(self, fn: F, /) -> F: ...

    @overload
    def tool(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        description: str | None = None,
        timeout_ms: int | None = None,
        output_schema: Mapping[str, Any] | None = None,
        global_: bool = False,
        requires_approval: bool = False,
    ) -> Callable[[F], F]: ...

    def tool(
        self,
        fn: F | None = None,
        /,
        *,
        name: str | None = None,
        description: str | None = None,
        timeout_ms: int | None = None,
        output_schema: Mapping[str, Any] | None = None,
        global_: bool = False,
        requires_approval: bool = False,
    ) -> F | Callable[[F], F]:
        """Register a typed function as a tool; its parameters become the JSON Schema.

        Usable bare (`@registry.tool`) or configured (`@registry.tool(name=...)`); returns
        the function unchanged so it stays directly callable.
        """

        def decorate(func: F) -> F:
            tool_name = name or func.__name__
            _check_common(tool_name, func, timeout_ms)
            try:
                spec = analyse_function(func)
            except TypeError as exc:
                raise TypeError(f"Tool {tool_name!r}: {exc}") from exc
            compiled_validator(spec.parameters)
            self._tools[tool_name] = RegisteredTool(
                name=tool_name,
                description=description if description is not None else spec.description,
                parameters=spec.parameters,
                handler=func,
                is_async=_is_async(func),
                wants_context=spec.context_param is not None,
                call_style="kwargs",
                timeout_ms=timeout_ms,
                bind=_spec_binder(spec),
                output_schema=_checked_output_schema(
                    tool_name, output_schema if output_schema is not None else spec.output_schema
                ),
                is_global=global_,
                requires_approval=requires_approval,
            )
            return func

        return decorate(fn) if fn is not None else decorate

    def get(self, name: str) -> RegisteredTool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return sorted(self._tools)

    def copy(self) -> ToolRegistry:
        """An independent registry with the same tools (entries are immutable, so shared)."""
        clone = ToolRegistry()
        clone._tools = dict(self._tools)
        return clone

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def __iter__(self) -> Iterator[RegisteredTool]:
        return iter(list(self._tools.values()))


def _check_common(name: str, handler: Callable[..., Any], timeout_ms: int | None) -> None:
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ValueError(f"Invalid tool name {name!r}: use 1-64 characters from A-Z a-z 0-9 _ -")
    if not callable(handler):
        raise TypeError(f"Tool {name!r}: handler must be callable")
    bad_timeout = isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or timeout_ms <= 0
    if timeout_ms is not None and bad_timeout:
        raise ValueError(f"Tool {name!r}: timeout_ms must be a positive integer")


def _checked_output_schema(name: str, schema: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if schema is None:
        return None
    try:
        compiled_validator(dict(schema))
    except SchemaError as exc:
        raise ValueError(f"Tool {name!r}: invalid output schema: {exc.message}") from exc
    return dict(schema)


def _is_async(handler: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(handler):
        return True
    call = getattr(handler, "__call__", None)  # noqa: B004 - async __call__ on a callable object
    return call is not None and inspect.iscoroutinefunction(call)


def _summary(handler: Callable[..., Any]) -> str:
    doc = inspect.getdoc(handler) or ""
    return " ".join(line.strip() for line in doc.strip().split("\n\n", 1)[0].splitlines())


def _context_parameter(handler: Callable[..., Any]) -> tuple[bool, str | None]:
    """How an input-style handler takes the context: `(as 2nd positional, keyword name)`."""
    try:
        params = list(inspect.signature(handler).parameters.values())
    except (TypeError, ValueError):
        return False, None
    try:
        hints = typing.get_type_hints(handler)
    except Exception:
        hints = {}
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    for index, param in enumerate(params):
        annotation = hints.get(param.name, param.annotation)
        if index > 0 and (is_context_annotation(annotation) or annotation == "ToolContext"):
            if param.kind is param.KEYWORD_ONLY or index != 1:
                return False, param.name
            return True, None
    has_var_positional = any(p.kind is p.VAR_POSITIONAL for p in params)
    return len(positional) >= 2 or has_var_positional, None


def _input_binder(*, positional_context: bool, context_keyword: str | None) -> Binder:
    # The handler gets a shallow copy so it cannot rewrite the input the trace records.
    if positional_context:
        return lambda arguments, context: ((dict(arguments), context), _NO_KWARGS)
    if context_keyword is not None:
        return lambda arguments, context: ((dict(arguments),), {context_keyword: context})
    return lambda arguments, context: ((dict(arguments),), _NO_KWARGS)


def _plain_kwargs_binder(context_keyword: str | None) -> Binder:
    def bind(arguments: dict[str, Any], context: ToolContext) -> tuple[tuple[Any, ...], dict[str, Any]]:
        kwargs = dict(arguments)
        if context_keyword is not None:
            kwargs[context_keyword] = context
        return (), kwargs

    return bind


def _spec_binder(spec: FunctionSpec) -> Binder:
    """Keyword binding for a `@tool` function: checks names, converts models/enums, adds context."""
    names, required, converters = spec.param_names, spec.required, spec.converters
    strict_names = not spec.accepts_var_kwargs

    def bind(arguments: dict[str, Any], context: ToolContext) -> tuple[tuple[Any, ...], dict[str, Any]]:
        kwargs = dict(arguments)
        problems: list[str] = []
        if strict_names:
            problems.extend(f"{extra}: unexpected argument" for extra in sorted(kwargs.keys() - names))
        missing = sorted(required - kwargs.keys())
        problems.extend(f"{param}: missing required argument" for param in missing)
        for param, adapter in converters.items():
            if param in kwargs:
                try:
                    kwargs[param] = adapter.validate_python(kwargs[param])
                except pydantic.ValidationError as exc:
                    problems.extend(f"{json_path((param, *e['loc']))}: {e['msg']}" for e in exc.errors())
        if problems:
            raise ToolArgumentError(problems)
        for param, info in spec.field_defaults.items():
            if param not in kwargs:
                kwargs[param] = info.get_default(call_default_factory=True)
        if spec.context_param is not None:
            kwargs[spec.context_param] = context
        return (), kwargs

    return bind


default_registry = ToolRegistry()
"""The process-wide registry behind `register_tool` / `tool`, for user code at the edge."""


def register_tool(name: str, handler: Callable[..., Any], **kwargs: Any) -> RegisteredTool:
    """Register a handler on `default_registry` (`registerTool` in the TypeScript SDK)."""
    return default_registry.register(name, handler, **kwargs)


registerTool = register_tool


@overload
def tool(fn: F, /) -> F: ...


@overload
def tool(
    fn: None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout_ms: int | None = None,
    output_schema: Mapping[str, Any] | None = None,
    global_: bool = False,
    requires_approval: bool = False,
) -> Callable[[F], F]: ...


def tool(
    fn: F | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout_ms: int | None = None,
    output_schema: Mapping[str, Any] | None = None,
    global_: bool = False,
    requires_approval: bool = False,
) -> F | Callable[[F], F]:
    """`@tool` / `@tool(name=...)` on `default_registry`; see `ToolRegistry.tool`."""
    decorate: Callable[[F], F] = default_registry.tool(
        name=name,
        description=description,
        timeout_ms=timeout_ms,
        output_schema=output_schema,
        global_=global_,
        requires_approval=requires_approval,
    )
    return decorate(fn) if fn is not None else decorate
