"""Toolboxes: a class whose public methods become tools that share state (llm's `Toolbox`).

    @toolbox
    class Notes(Toolbox):
        def __init__(self) -> None:
            self.items: list[str] = []

        def add(self, text: str) -> int:
            "Add a note; returns how many there are."
            self.items.append(text)
            return len(self.items)

registers `Notes_add` (and one tool per other public method), each with its schema from the
method's type hints and docstring, as `@tool` does for a function. The tool name is
`<prefix>_<method>`; the prefix is the class name unless given (`@toolbox(prefix="notes")`).

**One instance per run.** Each run has its own instance, made with `cls()`; its public
attributes (JSON values) are its state, kept in the run's state under `toolbox:<prefix>` and
written by each call's `update_state`, so in the same transaction as the call's trace row: a run
resumed after a crash finds the state of every committed call and nothing of one that did not
commit (that call runs again, as any handler does). Calls of one toolbox in one run are
serialized in the process, and parallel calls of one round see each other's changes.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import typing
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar, overload

from stevora.tools.registry import RegisteredTool, ToolContext, ToolRegistry, default_registry
from stevora.tools.schema import is_context_annotation

T = TypeVar("T", bound=type)

STATE_PREFIX = "toolbox:"
_CACHE_SIZE = 1024


class Toolbox:
    """Base of toolboxes (optional: any class with a no-argument constructor works)."""

    prefix: ClassVar[str | None] = None


class _Live:
    """Instances made in this process, so parallel calls of one round see each other's changes."""

    def __init__(self) -> None:
        self.entries: OrderedDict[tuple[str, str], tuple[tuple[str, int], int, dict[str, Any]]] = (
            OrderedDict()
        )
        self.locks: OrderedDict[tuple[str, str], asyncio.Lock] = OrderedDict()

    def lock(self, key: tuple[str, str]) -> asyncio.Lock:
        lock = self.locks.get(key)
        if lock is None:
            lock = self.locks[key] = asyncio.Lock()
            while len(self.locks) > _CACHE_SIZE:
                self.locks.popitem(last=False)
        return lock

    def remember(
        self, key: tuple[str, str], round_: tuple[str, int], calls: int, saved: dict[str, Any]
    ) -> None:
        self.entries[key] = (round_, calls, saved)
        self.entries.move_to_end(key)
        while len(self.entries) > _CACHE_SIZE:
            self.entries.popitem(last=False)


_live = _Live()


def toolbox_tools(registry: ToolRegistry, prefix: str) -> list[RegisteredTool]:
    """The registered tools of the toolbox registered under `prefix`, in name order."""
    return [t for t in registry if getattr(t.handler, "__stevora_toolbox__", None) == prefix]


def state_key(prefix: str) -> str:
    return STATE_PREFIX + prefix


def toolbox_state(instance: Any) -> dict[str, Any]:
    """The public attributes of an instance: its state (JSON values only)."""
    state = {k: v for k, v in vars(instance).items() if not k.startswith("_")}
    try:
        json.dumps(state)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"Toolbox {type(instance).__name__}'s attributes must be JSON values: {exc}"
        ) from None
    return state


def _calls(saved: Any) -> int:
    return int(saved.get("calls", 0)) if isinstance(saved, dict) else 0


def _restore(cls: type, saved: Any) -> tuple[Any, int]:
    """A fresh instance (`cls()`) with the saved attributes; a copy, never the saved values."""
    instance = cls()
    if isinstance(saved, dict) and isinstance(saved.get("attributes"), dict):
        vars(instance).update(json.loads(json.dumps(saved["attributes"])))
    return instance, _calls(saved)


def _methods(cls: type) -> list[tuple[str, Callable[..., Any]]]:
    found: list[tuple[str, Callable[..., Any]]] = []
    for name in dir(cls):
        if name.startswith("_") or any(name in vars(base) for base in (Toolbox, object)):
            continue
        member = inspect.getattr_static(cls, name)
        if isinstance(member, staticmethod | classmethod | property) or not inspect.isfunction(member):
            continue
        found.append((name, member))
    return found


def register_toolbox(
    cls: type, *, prefix: str | None = None, registry: ToolRegistry | None = None
) -> list[str]:
    """Register every public method of `cls` as the tool `<prefix>_<method>`; returns the names."""
    registry = registry if registry is not None else default_registry
    prefix = prefix or getattr(cls, "prefix", None) or cls.__name__
    required = [
        p.name
        for p in inspect.signature(cls).parameters.values()
        if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if required:
        raise TypeError(
            f"Toolbox {cls.__name__}: each run makes its own instance with {cls.__name__}(), "
            f"so __init__ cannot require arguments ({', '.join(required)})"
        )
    methods = _methods(cls)
    if not methods:
        raise TypeError(f"Toolbox {cls.__name__} has no public methods to offer as tools")
    names = []
    for method_name, method in methods:
        tool_name = f"{prefix}_{method_name}"
        registry.tool(name=tool_name)(_tool_function(cls, prefix, tool_name, method_name, method))
        names.append(tool_name)
    return names


def _tool_function(
    cls: type, prefix: str, tool_name: str, method_name: str, method: Callable[..., Any]
) -> Callable[..., Any]:
    """A function with the method's parameters (less `self`) and a ToolContext, which runs the
    method on the run's instance and writes the instance's state with the call."""
    hints = typing.get_type_hints(method, include_extras=True)
    params = list(inspect.signature(method).parameters.values())[1:]
    own_context = next((p.name for p in params if is_context_annotation(hints.get(p.name))), None)
    context_name = own_context or "_toolbox_context"
    if own_context is None:
        params.append(inspect.Parameter(context_name, inspect.Parameter.KEYWORD_ONLY, annotation=ToolContext))
    key = state_key(prefix)
    is_async = inspect.iscoroutinefunction(method)

    async def call(**kwargs: Any) -> Any:
        context: ToolContext = kwargs[context_name] if own_context else kwargs.pop(context_name)
        this_round = (context.step_run_id, context.round)
        async with _live.lock((context.workflow_run_id, prefix)):
            saved = context.state.get(key)
            cached = _live.entries.get((context.workflow_run_id, prefix))
            if cached is not None and cached[0] == this_round and cached[1] > _calls(saved):
                saved = cached[2]  # an earlier call of this round, not in the snapshot yet
            instance, calls = _restore(cls, saved)
            bound = getattr(instance, method_name)
            if is_async:
                result = await bound(**kwargs)
            else:  # off the event loop, as a plain sync handler runs
                result = await asyncio.to_thread(functools.partial(bound, **kwargs))
            state = {"calls": calls + 1, "attributes": toolbox_state(instance)}
            context.update_state({key: state})
            _live.remember((context.workflow_run_id, prefix), this_round, calls + 1, state)
        return result

    functools.update_wrapper(call, method)
    call.__name__ = tool_name
    call.__qualname__ = f"{cls.__qualname__}.{method_name}"
    call.__module__ = cls.__module__
    call.__stevora_toolbox__ = prefix  # type: ignore[attr-defined]  # `tools: ["<prefix>"]` offers them all
    call.__signature__ = inspect.signature(method).replace(parameters=params)  # type: ignore[attr-defined]
    call.__annotations__ = {
        **{k: v for k, v in hints.items() if k != "self"},
        **({} if own_context else {context_name: ToolContext}),
    }
    del call.__wrapped__  # type: ignore[attr-defined]  # inspect must see the signature above
    return call


@overload
def toolbox(cls: T, /) -> T: ...
@overload
def toolbox(*, prefix: str | None = None, registry: ToolRegistry | None = None) -> Callable[[T], T]: ...
def toolbox(
    cls: T | None = None, /, *, prefix: str | None = None, registry: ToolRegistry | None = None
) -> T | Callable[[T], T]:
    """Class decorator: `register_toolbox(cls)`; returns the class unchanged."""

    def decorate(klass: T) -> T:
        register_toolbox(klass, prefix=prefix, registry=registry)
        return klass

    return decorate(cls) if cls is not None else decorate
