"""`AsyncAgentRuntime`: the asyncio client (httpx.AsyncClient). Same operations as `sync.py`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from types import TracebackType
from typing import Any

import httpx

from stevora.client import protocol as p
from stevora.client.errors import StevoraAPIError, error_from_response
from stevora.client.resources import Async, ClientRoot


class _AsyncDriver(p.DriverBase):
    """Performs operations' steps with an asyncio httpx client."""

    http: httpx.AsyncClient

    async def run(self, op: p.Op[Any]) -> Any:
        async with aclosing(self._drive(op)) as items:
            async for item in items:
                if isinstance(item, p.Done):
                    return item.value
        raise AssertionError("unreachable: _drive always ends with Done")

    async def iterate(self, op: p.StreamOp[Any]) -> AsyncIterator[Any]:
        async with aclosing(self._drive(op)) as items:
            async for item in items:
                if isinstance(item, p.Emit):
                    yield item.item

    async def _drive(self, op: p.Op[Any] | p.StreamOp[Any]) -> AsyncGenerator[p.Emit[Any] | p.Done, None]:
        stream: list[
            tuple[httpx.Response, AsyncIterator[str]]
        ] = []  # the operation's open event stream and its lines
        outcome = p.Outcome()
        try:
            while not isinstance(step := p.advance(op, outcome), p.Done):
                if isinstance(step, p.Emit):
                    yield step
                    outcome = p.Outcome()
                else:
                    outcome = await self._perform(step, stream)
            yield step
        finally:
            await _aclose(stream)
            op.close()

    async def _perform(
        self, step: p.Step, stream: list[tuple[httpx.Response, AsyncIterator[str]]]
    ) -> p.Outcome:
        try:
            if isinstance(step, p.Sleep):
                await asyncio.sleep(step.seconds)
            elif isinstance(step, p.NextLine):
                return p.Outcome(await anext(stream[0][1], None) if stream else None)
            elif isinstance(step, p.OpenStream):
                await _aclose(stream)
                response = await self._send(step.request, stream=True)
                stream.append((response, response.aiter_lines()))
            else:
                return p.Outcome(await self._send(step, stream=False))
        except (httpx.HTTPError, StevoraAPIError) as exc:
            return p.failure(exc, step)
        return p.Outcome()

    async def _send(self, request: p.Request, *, stream: bool) -> httpx.Response:
        response = await self.http.send(self.build(request), stream=stream)
        if not p.accepted(response, request):
            await response.aread()
            await response.aclose()
            raise error_from_response(response)
        return response


async def _aclose(stream: list[tuple[httpx.Response, AsyncIterator[str]]]) -> None:
    while stream:
        await stream.pop()[0].aclose()


class AsyncAgentRuntime(ClientRoot[Async]):
    """The Stevora API client for asyncio: `async with AsyncAgentRuntime(api_key) as rt: ...`.

    Same namespaces and arguments as `AgentRuntime`; methods are awaited, and `iter_events` /
    `stream` return async iterators. `transport` is an optional `httpx.AsyncBaseTransport`
    (e.g. `httpx.ASGITransport(app=...)` in tests).
    """

    _http: httpx.AsyncClient
    _http_class = httpx.AsyncClient
    _driver_class = _AsyncDriver

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncAgentRuntime:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
