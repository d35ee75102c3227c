"""The client's namespaces (`rt.workflows`, `rt.approvals`, ...), defined once for both clients.

Each method is an `operation` (or an `iteration`) wrapping a function of `operations.py`. Read
through a sync client it runs the operation and returns its result; through an async client it
returns a coroutine (or an async iterator). The overloads on `__get__` give type checkers the
right signature for each: `rt.workflows.get(id) -> WorkflowRun` on `AgentRuntime`,
`-> Coroutine[..., WorkflowRun]` on `AsyncAgentRuntime`.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, Generic, ParamSpec, Protocol, TypeVar, overload

import httpx

from stevora.client import operations as ops
from stevora.client import threads, triggers
from stevora.client.protocol import DEFAULT_BASE_URL, DEFAULT_TIMEOUT_S, Op, StreamOp, http_options

P = ParamSpec("P")
T = TypeVar("T")


class Sync:
    """Marker: namespaces of `AgentRuntime`."""


class Async:
    """Marker: namespaces of `AsyncAgentRuntime`."""


Mode = TypeVar("Mode", Sync, Async)


class Driver(Protocol):
    def run(self, op: Op[Any]) -> Any: ...

    def iterate(self, op: StreamOp[Any]) -> Any: ...


class Namespace(Generic[Mode]):
    def __init__(self, driver: Driver) -> None:
        self._driver = driver


class operation(Generic[P, T]):
    """A method running `build(*args)` on the namespace's driver."""

    def __init__(self, build: Callable[P, Op[T]]) -> None:
        self.build = build
        self.__doc__ = build.__doc__

    @overload
    def __get__(self, obj: None, owner: type) -> operation[P, T]: ...
    @overload
    def __get__(self, obj: Namespace[Sync], owner: type) -> Callable[P, T]: ...
    @overload
    def __get__(self, obj: Namespace[Async], owner: type) -> Callable[P, Coroutine[Any, Any, T]]: ...
    def __get__(self, obj: Namespace[Any] | None, owner: type) -> Any:
        if obj is None:
            return self
        run, build = obj._driver.run, self.build
        return functools.wraps(build)(lambda *args, **kwargs: run(build(*args, **kwargs)))


class iteration(Generic[P, T]):
    """A method returning an iterator (sync) or async iterator (async) over what `build` emits."""

    def __init__(self, build: Callable[P, StreamOp[T]]) -> None:
        self.build = build
        self.__doc__ = build.__doc__

    @overload
    def __get__(self, obj: None, owner: type) -> iteration[P, T]: ...
    @overload
    def __get__(self, obj: Namespace[Sync], owner: type) -> Callable[P, Iterator[T]]: ...
    @overload
    def __get__(self, obj: Namespace[Async], owner: type) -> Callable[P, AsyncIterator[T]]: ...
    def __get__(self, obj: Namespace[Any] | None, owner: type) -> Any:
        if obj is None:
            return self
        iterate, build = obj._driver.iterate, self.build
        return functools.wraps(build)(lambda *args, **kwargs: iterate(build(*args, **kwargs)))


class Workspaces(Namespace[Mode]):
    current = operation(ops.current_workspace)
    create = operation(ops.create_workspace)


class ApiKeys(Namespace[Mode]):
    create = operation(ops.create_api_key)
    list = operation(ops.list_api_keys)
    revoke = operation(ops.revoke_api_key)


class Definitions(Namespace[Mode]):
    create = operation(ops.create_definition)
    list = operation(ops.list_definitions)
    get = operation(ops.get_definition)
    find = operation(ops.find_definition)
    apply = operation(ops.apply_definition)


class Workflows(Namespace[Mode]):
    create = operation(ops.create_run)
    get = operation(ops.get_run)
    list = operation(ops.list_runs)
    cancel = operation(ops.cancel_run)
    retry = operation(ops.retry_run)
    pause = operation(ops.pause_run)
    resume = operation(ops.resume_run)
    set_budget = operation(ops.set_run_budget)
    submit_tool_outputs = operation(ops.submit_tool_outputs)
    events = operation(ops.list_events)
    iter_events = iteration(ops.iter_events)
    stream = iteration(ops.stream_events)
    llm_calls = operation(ops.llm_calls)
    tool_traces = operation(ops.tool_traces)
    cost = operation(ops.run_cost)
    wait_for_completion = operation(ops.wait_for_completion)
    run_until_action = operation(ops.run_until_action)
    checkpoints = operation(ops.checkpoints)
    fork = operation(ops.fork)
    replay = operation(ops.replay)
    lineage = operation(ops.lineage)
    bulk_replay = operation(ops.bulk_replay)
    compare_replays = operation(ops.compare_replays)
    retry_failed = operation(ops.retry_failed)


class Approvals(Namespace[Mode]):
    list = operation(ops.list_approvals)
    get = operation(ops.get_approval)
    decide = operation(ops.decide_approval)


class Webhooks(Namespace[Mode]):
    create = operation(ops.create_webhook)
    list = operation(ops.list_webhooks)
    delete = operation(ops.delete_webhook)
    deliveries = operation(ops.webhook_deliveries)


class Schedules(Namespace[Mode]):
    create = operation(triggers.create_schedule)
    list = operation(triggers.list_schedules)
    get = operation(triggers.get_schedule)
    update = operation(triggers.update_schedule)
    delete = operation(triggers.delete_schedule)
    trigger = operation(triggers.trigger_schedule)
    backfill = operation(triggers.backfill_schedule)


class Events(Namespace[Mode]):
    send = operation(triggers.send_event)
    list = operation(triggers.list_events)


class Hooks(Namespace[Mode]):
    create = operation(triggers.create_hook)
    list = operation(triggers.list_hooks)
    delete = operation(triggers.delete_hook)


class Threads(Namespace[Mode]):
    create = operation(threads.create_thread)
    fork = operation(threads.fork_thread)
    get = operation(threads.get_thread)
    list = operation(threads.list_threads)
    delete = operation(threads.delete_thread)
    send = operation(threads.send)
    messages = operation(threads.messages)
    stream = iteration(threads.stream_thread)
    steer = operation(threads.steer)


class Store(Namespace[Mode]):
    put = operation(threads.store_put)
    get = operation(threads.store_get)
    delete = operation(threads.store_delete)
    search = operation(threads.store_search)


class Costs(Namespace[Mode]):
    summary = operation(ops.cost_summary)


class ClientRoot(Namespace[Mode]):
    """What `AgentRuntime` and `AsyncAgentRuntime` share: construction, `health()`, the namespaces."""

    _http_class: Any  # httpx.Client or httpx.AsyncClient
    _driver_class: Callable[[Any, str | None], Driver]

    health = operation(ops.health)
    rate_limits = operation(ops.rate_limits)

    def __init__(
        self,
        api_key: str | None = None,
        base_url: str = DEFAULT_BASE_URL,
        timeout: float = DEFAULT_TIMEOUT_S,
        transport: httpx.BaseTransport | httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url
        self._http = self._http_class(**http_options(base_url, timeout, transport))
        driver = self._driver_class(self._http, api_key)
        super().__init__(driver)
        self.workspaces: Workspaces[Mode] = Workspaces(driver)
        self.api_keys: ApiKeys[Mode] = ApiKeys(driver)
        self.definitions: Definitions[Mode] = Definitions(driver)
        self.workflows: Workflows[Mode] = Workflows(driver)
        self.approvals: Approvals[Mode] = Approvals(driver)
        self.webhooks: Webhooks[Mode] = Webhooks(driver)
        self.cost: Costs[Mode] = Costs(driver)
        self.schedules: Schedules[Mode] = Schedules(driver)
        self.events: Events[Mode] = Events(driver)
        self.hooks: Hooks[Mode] = Hooks(driver)
        self.threads: Threads[Mode] = Threads(driver)
        self.store: Store[Mode] = Store(driver)
