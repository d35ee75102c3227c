"""The client without I/O: what an operation asks its driver to do, and how answers are parsed.

Every client operation (`stevora.client.operations`) is written once, as a generator that yields
*steps* — send this request, open this event stream, give me the next line, sleep, emit an item —
and receives each step's result. The sync driver (`sync.py`) performs the steps with
`httpx.Client` and `time.sleep`, the async one (`async_.py`) with `httpx.AsyncClient` and
`asyncio.sleep`. A failed step is thrown back into the operation as the typed client error, so an
operation can catch it (`definitions.apply` catches `Conflict`; `stream` reconnects).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeAlias, TypeVar

import httpx

from stevora.client.errors import StevoraClientError, StevoraConnectionError, StevoraTimeoutError
from stevora.client.models import Model, Page, PageMeta

T = TypeVar("T")
M = TypeVar("M", bound=Model)

DEFAULT_BASE_URL = "http://localhost:3000"
DEFAULT_TIMEOUT_S = 30.0
USER_AGENT = "stevora-python-client/0.1"


@dataclass(frozen=True, slots=True)
class Request:
    """Send one request; the reply is the `httpx.Response` (2xx, or a status in `accept`)."""

    method: str
    path: str
    params: dict[str, Any] | None = None
    json: Any = None
    headers: dict[str, str] | None = None
    authenticated: bool = True
    """Send the client's `x-api-key` (off for health checks and admin-token calls)."""
    accept: tuple[int, ...] = ()
    held_s: float = 0.0
    """How long the server may hold the answer (`?wait=`): added to the read timeout."""


@dataclass(frozen=True, slots=True)
class OpenStream:
    """Open a streaming response (replacing any stream this operation had open); reply `None`."""

    request: Request


@dataclass(frozen=True, slots=True)
class NextLine:
    """Read the next line of the open stream; reply `str`, or `None` when it ended cleanly."""


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


@dataclass(frozen=True, slots=True)
class Emit(Generic[T]):
    """Hand `item` to the caller of an iterating operation; reply `None`."""

    item: T


Step: TypeAlias = Request | OpenStream | NextLine | Sleep
Op: TypeAlias = Generator[Step, Any, T]
"""An operation returning T."""
StreamOp: TypeAlias = Generator[Step | Emit[T], Any, None]
"""An operation emitting a sequence of T."""

NEXT_LINE = NextLine()


@dataclass(frozen=True, slots=True)
class Done:
    value: Any


@dataclass(slots=True)
class Outcome:
    """What performing a step gave: a reply, or an error to throw into the operation."""

    reply: Any = None
    error: StevoraClientError | None = None


def advance(op: Generator[Any, Any, Any], outcome: Outcome) -> Step | Emit[Any] | Done:
    """Resume `op` with the outcome of its last step; the next step, or `Done` with its result."""
    try:
        if outcome.error is not None:
            return op.throw(outcome.error)  # type: ignore[no-any-return]
        return op.send(outcome.reply)  # type: ignore[no-any-return]
    except StopIteration as stop:
        return Done(stop.value)


def http_options(base_url: str, timeout_s: float, transport: Any) -> dict[str, Any]:
    """Keyword arguments shared by `httpx.Client` and `httpx.AsyncClient`."""
    return {
        "base_url": base_url.rstrip("/"),
        "timeout": timeout_s,
        "transport": transport,
        "headers": {"user-agent": USER_AGENT, "accept": "application/json"},
    }


class DriverBase:
    """What the sync and async drivers share: the httpx client and how requests are built."""

    def __init__(self, http: httpx.Client | httpx.AsyncClient, api_key: str | None) -> None:
        self.http = http
        self.api_key = api_key

    def build(self, request: Request) -> httpx.Request:
        headers = dict(request.headers or {})
        if request.authenticated and self.api_key:
            headers["x-api-key"] = self.api_key
        params = {k: v for k, v in (request.params or {}).items() if v is not None}
        extra: dict[str, Any] = {}
        timeout = self.http.timeout
        if request.held_s and timeout.read is not None:
            extra["timeout"] = httpx.Timeout(
                connect=timeout.connect,
                read=timeout.read + request.held_s,
                write=timeout.write,
                pool=timeout.pool,
            )
        return self.http.build_request(
            request.method, request.path, params=params, headers=headers, json=request.json, **extra
        )


def failure(exc: httpx.HTTPError | StevoraClientError, step: Step) -> Outcome:
    """The outcome of a step that raised: the typed client error, to throw into the operation."""
    return Outcome(error=exc if isinstance(exc, StevoraClientError) else connection_error(exc, step))


def connection_error(exc: httpx.HTTPError, step: Step) -> StevoraConnectionError:
    """The client error for an httpx failure while performing `step`."""
    request = step.request if isinstance(step, OpenStream) else step
    where = f"{request.method} {request.path}" if isinstance(request, Request) else "reading the event stream"
    if isinstance(exc, httpx.TimeoutException):
        return StevoraTimeoutError(f"Timed out: {where} ({type(exc).__name__})")
    return StevoraConnectionError(f"Connection failed: {where}: {exc or type(exc).__name__}")


def accepted(response: httpx.Response, request: Request) -> bool:
    return response.is_success or response.status_code in request.accept


def data_of(response: httpx.Response) -> Any:
    """The `data` of a success envelope."""
    body = response.json()
    return body["data"] if isinstance(body, dict) and "data" in body else body


def parse(model: type[M], response: httpx.Response) -> M:
    return model.model_validate(data_of(response))


def parse_list(model: type[M], response: httpx.Response) -> list[M]:
    return [model.model_validate(item) for item in data_of(response)]


def parse_page(model: type[M], response: httpx.Response) -> Page[M]:
    body = response.json()
    items = [model.model_validate(item) for item in body["data"]]
    meta = body.get("meta") or {"page": 1, "pageSize": len(items), "total": len(items), "totalPages": 1}
    return Page(data=items, meta=PageMeta.model_validate(meta))


@dataclass(slots=True)
class ServerSentEvent:
    event: str = "message"
    data: str = ""
    id: str | None = None


@dataclass(slots=True)
class SSEDecoder:
    """Turns `text/event-stream` lines into events (comments and keep-alives are skipped)."""

    _event: str = ""
    _data: list[str] = field(default_factory=list)
    _id: str | None = None

    def feed(self, line: str) -> ServerSentEvent | None:
        """Feed one line (without its newline); returns an event when a blank line completes one."""
        if not line:
            if not self._data:
                self._event = ""
                return None
            sse = ServerSentEvent(self._event or "message", "\n".join(self._data), self._id)
            self._event, self._data = "", []
            return sse
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            self._id = value
        return None
