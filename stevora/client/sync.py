"""`AgentRuntime`: the synchronous client (httpx.Client)."""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator
from contextlib import closing
from types import TracebackType
from typing import Any

import httpx

from stevora.client import protocol as p
from stevora.client.errors import StevoraAPIError, error_from_response
from stevora.client.resources import ClientRoot, Sync


class _SyncDriver(p.DriverBase):
    """Performs operations' steps with a blocking httpx client."""

    http: httpx.Client

    def run(self, op: p.Op[Any]) -> Any:
        with closing(self._drive(op)) as items:
            return next(item.value for item in items if isinstance(item, p.Done))

    def iterate(self, op: p.StreamOp[Any]) -> Iterator[Any]:
        with closing(self._drive(op)) as items:
            yield from (item.item for item in items if isinstance(item, p.Emit))

    def _drive(self, op: p.Op[Any] | p.StreamOp[Any]) -> Generator[p.Emit[Any] | p.Done, None, None]:
        stream: list[
            tuple[httpx.Response, Iterator[str]]
        ] = []  # the operation's open event stream and its lines
        outcome = p.Outcome()
        try:
            while not isinstance(step := p.advance(op, outcome), p.Done):
                if isinstance(step, p.Emit):
                    yield step
                    outcome = p.Outcome()
                else:
                    outcome = self._perform(step, stream)
            yield step
        finally:
            _close(stream)
            op.close()

    def _perform(self, step: p.Step, stream: list[tuple[httpx.Response, Iterator[str]]]) -> p.Outcome:
        try:
            if isinstance(step, p.Sleep):
                time.sleep(step.seconds)
            elif isinstance(step, p.NextLine):
                return p.Outcome(next(stream[0][1], None) if stream else None)
            elif isinstance(step, p.OpenStream):
                _close(stream)
                response = self._send(step.request, stream=True)
                stream.append((response, response.iter_lines()))
            else:
                return p.Outcome(self._send(step, stream=False))
        except (httpx.HTTPError, StevoraAPIError) as exc:
            return p.failure(exc, step)
        return p.Outcome()

    def _send(self, request: p.Request, *, stream: bool) -> httpx.Response:
        response = self.http.send(self.build(request), stream=stream)
        if not p.accepted(response, request):
            response.read()
            response.close()
            raise error_from_response(response)
        return response


def _close(stream: list[tuple[httpx.Response, Iterator[str]]]) -> None:
    while stream:
        stream.pop()[0].close()


class AgentRuntime(ClientRoot[Sync]):
    """The Stevora API client. Use it as a context manager, or call `close()`.

    `AgentRuntime(api_key, base_url="http://localhost:3000", timeout=30.0, transport=None)`;
    `transport` is an optional `httpx.BaseTransport` (tests, proxies). API errors raise
    `StevoraAPIError` subclasses, network failures `StevoraConnectionError`.
    """

    _http: httpx.Client
    _http_class = httpx.Client
    _driver_class = _SyncDriver

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> AgentRuntime:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
