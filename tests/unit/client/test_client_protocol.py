"""The client's error mapping, SSE decoding and stream resumption, against httpx mock transports."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from stevora.client import (
    AgentRuntime,
    AsyncAgentRuntime,
    InvalidStateTransition,
    RateLimited,
    ServerError,
    StevoraAPIError,
    StevoraConnectionError,
)
from stevora.client.protocol import SSEDecoder


def envelope_error(status: int, code: str, message: str = "nope", **extra: Any) -> httpx.Response:
    body = {"success": False, "error": {"code": code, "message": message, "details": {}}}
    return httpx.Response(status, json=body, **extra)


def client_answering(response: httpx.Response) -> AgentRuntime:
    return AgentRuntime("stv_k", base_url="http://t", transport=httpx.MockTransport(lambda request: response))


def test_error_envelopes_map_to_typed_exceptions_by_code_then_status() -> None:
    with pytest.raises(InvalidStateTransition) as bad_state:
        client_answering(
            envelope_error(409, "INVALID_STATE_TRANSITION", "Run is COMPLETED")
        ).workflows.cancel("r")
    assert bad_state.value.status_code == 409 and bad_state.value.message == "Run is COMPLETED"

    limited = envelope_error(429, "RATE_LIMIT_ERROR", "Too many requests", headers={"Retry-After": "7"})
    with pytest.raises(RateLimited) as rate:
        client_answering(limited).workflows.list()
    assert rate.value.retry_after_s == 7.0

    proxy = httpx.Response(502, text="<html>Bad gateway</html>")
    with pytest.raises(ServerError) as server:
        client_answering(proxy).workflows.list()
    assert server.value.code == "HTTP_502" and "Bad gateway" in server.value.message

    with pytest.raises(StevoraAPIError) as teapot:
        client_answering(envelope_error(418, "TEAPOT")).health()
    assert type(teapot.value) is StevoraAPIError and teapot.value.code == "TEAPOT"


def test_requests_carry_the_key_and_escape_ids_in_paths() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(
            200, json={"success": True, "data": {"id": "r", "definitionId": "d", "status": "X"}}
        )

    rt = AgentRuntime("stv_k", base_url="http://t/", transport=httpx.MockTransport(answer))
    run = rt.workflows.get("../api-keys")
    assert run.status == "X"
    assert seen[0].url.raw_path == b"/v1/workflow-runs/..%2Fapi-keys"
    assert seen[0].headers["x-api-key"] == "stv_k"


def test_degraded_health_is_returned_not_raised() -> None:
    details = {"status": "degraded", "checks": {"database": "ok", "queue": "error"}}
    body = {
        "success": False,
        "error": {"code": "SERVICE_UNAVAILABLE", "message": "degraded", "details": details},
    }
    health = client_answering(httpx.Response(503, json=body)).health()
    assert health.status == "degraded" and health.checks["queue"] == "error"


def test_sse_decoder_joins_data_lines_and_skips_comments() -> None:
    decoder = SSEDecoder()
    lines = [": keep-alive", "", "id: 4", "event: STEP_STARTED", 'data: {"a":', "data: 1}", ""]
    events = [e for e in map(decoder.feed, lines) if e is not None]
    assert len(events) == 1
    assert (events[0].id, events[0].event, events[0].data) == ("4", "STEP_STARTED", '{"a":\n1}')


def sse(sequence: int, event_type: str) -> bytes:
    event = {"id": f"evt_{sequence}", "workflowRunId": "r", "stepRunId": None, "sequence": sequence,
             "eventType": event_type, "payload": {}, "createdAt": "2026-04-02T12:00:00.000Z"}  # fmt: skip
    return f"id: {sequence}\nevent: {event_type}\ndata: {json.dumps(event)}\n\n".encode()


class BreaksAfter(httpx.SyncByteStream):
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    def __iter__(self) -> Iterator[bytes]:
        yield from self.chunks
        raise httpx.ReadError("connection reset")


def test_stream_resumes_after_a_dropped_connection_without_gaps_or_repeats() -> None:
    resumed_from: list[str | None] = []

    def answer(request: httpx.Request) -> httpx.Response:
        resumed_from.append(request.headers.get("last-event-id"))
        if len(resumed_from) == 1:
            return httpx.Response(
                200, stream=BreaksAfter([sse(1, "WORKFLOW_STARTED"), sse(2, "STEP_STARTED")])
            )
        return httpx.Response(200, content=sse(3, "STEP_COMPLETED") + sse(4, "WORKFLOW_COMPLETED"))

    rt = AgentRuntime("stv_k", base_url="http://t", transport=httpx.MockTransport(answer))
    events = list(rt.workflows.stream("r"))
    assert [e.sequence for e in events] == [1, 2, 3, 4]
    assert resumed_from == [None, "2"]


def test_stream_gives_up_after_repeated_connection_failures(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("time.sleep", lambda s: None)

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    rt = AgentRuntime("stv_k", base_url="http://t", transport=httpx.MockTransport(refuse))
    with pytest.raises(StevoraConnectionError):
        list(rt.workflows.stream("r"))


async def test_async_client_shares_the_operations_and_error_mapping() -> None:
    async def answer(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            return envelope_error(409, "CONFLICT", "exists")
        page = {"success": True, "data": [{"id": "wfdef_1", "name": "n", "version": "1", "steps": []}],
                "meta": {"page": 1, "pageSize": 100, "total": 1, "totalPages": 1}}  # fmt: skip
        return httpx.Response(200, json=page)

    async with AsyncAgentRuntime("stv_k", base_url="http://t", transport=httpx.MockTransport(answer)) as rt:
        existing = await rt.definitions.apply({"name": "n", "version": "1", "steps": []})
    assert existing.id == "wfdef_1"
