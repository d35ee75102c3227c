"""`AgentRuntime`: the synchronous client (httpx.Client)."""

from __future__ import annotations

import time
from contextlib import closing
from collections.abc import Iterator
from types import TracebackType
from typing import Any

import httpx

from stevora.client.errors import StevoraAPIError, error_from_response
from stevora.client.protocol import (
    DEFAULT_BASE_URL,
    DEFAULT_TIMEOUT_S,
    Done,
    Emit,
    NextLine,
    Op,
    OpenStream,
    Outcome,
    Request,
    Sleep,
    Step,
    StreamOp,
    accepted,
    advance,
    connection_error,
    http_options,
    request_options,
)
from stevora.client.resources import ClientRoot, Sync


class _Stream:
    """The event stream an operation has open (at most one)."""

    def __init__(self) -> None:
        self.response: httpx.Response | None = None
        self.lines: Iterator[str] = iter(())

    def close(self) -> None:
        if self.response is not None:
            self.response.close()
            self.response = None


class _SyncDriver:
    """Performs operations' steps with a blocking httpx client."""

    def __init__(self, http: httpx.Client, api_key: str | None) -> None:
        self.http = http
        self.api_key = api_key

    def run(self, op: Op[Any]) -> Any:
        with closing(self._drive(op)) as items:
            for item in items:
                if isinstance(item, Done):
                    return item.value
        raise AssertionError("operation ended without a result")

    def iterate(self, op: StreamOp[Any]) -> Iterator[Any]:
        with closing(self._drive(op)) as items:
            for item in items:
                if isinstance(item, Emit):
                    yield item.item

    def _drive(self, op: Op[Any] | StreamOp[Any]) -> Iterator[Emit[Any] | Done]:
        stream, outcome = _Stream(), Outcome()
        try:
            while not isinstance(step := advance(op, outcome), Done):
                if isinstance(step, Emit):
                    yield step
                    outcome = Outcome()
                else:
                    outcome = self._perform(step, stream)
            yield step
        finally:
            stream.close()
            op.close()

    def _perform(self, step: Step, stream: _Stream) -> Outcome:
        try:
            if isinstance(step, Sleep):
                time.sleep(step.seconds)
            elif isinstance(step, NextLine):
                return Outcome(next(stream.lines, None))
            elif isinstance(step, OpenStream):
                stream.close()
                stream.response = self._send(step.request, stream=True)
                stream.lines = stream.response.iter_lines()
            else:
                return Outcome(self._send(step, stream=False))
        except httpx.HTTPError as exc:
            return Outcome(error=connection_error(exc, step))
        except StevoraAPIError as exc:
            return Outcome(error=exc)
        return Outcome()

    def _send(self, request: Request, *, stream: bool) -> httpx.Response:
        response = self.http.send(self.http.build_request(**request_options(request, self.api_key)), stream=stream)
        if not accepted(response, request):
            response.read()
            response.close()
            raise error_from_response(response)
        return response


class AgentRuntime(ClientRoot[Sync]):
    """The Stevora API client. Use it as a context manager, or call `close()`.

    `AgentRuntime(api_key, base_url="http://localhost:3000", timeout=30.0)`; `transport` is an
    optional `httpx.BaseTransport` (tests, proxies). Errors raise `StevoraAPIError` subclasses.
    """

    def __init__(
        self,
        api_key: str | None = None,
        base_url: str = DEFAULT_BASE_URL,
        timeout: float = DEFAULT_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url
        self._http = httpx.Client(**http_options(base_url, timeout, transport))
        super().__init__(_SyncDriver(self._http, api_key))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> AgentRuntime:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
