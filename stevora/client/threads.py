"""The client's side of threads and the memory store (docs/threads.md): `client.threads`,
`client.store`. Operations are generators of requests (`stevora.client.protocol`); the sync and
async clients run them."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal
from urllib.parse import quote

from stevora.client.errors import StevoraConnectionError
from stevora.client.models import TERMINAL_EVENTS, Event, Model, Page
from stevora.client.protocol import (
    NEXT_LINE,
    Emit,
    Op,
    OpenStream,
    Request,
    Sleep,
    SSEDecoder,
    StreamOp,
    parse,
    parse_list,
    parse_page,
)

OnActive = Literal["reject", "enqueue", "interrupt", "steer"]
_RECONNECTS = 5


def _path(*parts: str) -> str:
    return "/v1/" + "/".join(quote(p, safe="") if i else p for i, p in enumerate(parts))


class Thread(Model):
    id: str
    workspace_id: str
    definition_id: str
    metadata: dict[str, Any] = {}
    state: dict[str, Any] = {}
    on_active: str = "reject"
    forked_from_run_id: str | None = None
    active_run_id: str | None = None
    queued_run_ids: list[str] = []
    created_at: datetime | None = None
    updated_at: datetime | None = None


class SentMessage(Model):
    """What a message did: the turn it started (`policy` "start" or "interrupt"), the turn it
    waits behind ("enqueue") or the active run it was sent into ("steer")."""

    run_id: str
    policy: str
    message_id: str | None = None
    interrupted_run_id: str | None = None


class ThreadMessage(Model):
    role: str
    content: Any = None
    run_id: str
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    injected_round: int | None = None
    status: str | None = None


class TextDelta(Model):
    """Live text of a turn's streamed model call (ephemeral; the stored events are the truth)."""

    run_id: str
    text: str = ""
    round: int | None = None
    offset: int | None = None


class StoreItem(Model):
    namespace: list[str]
    key: str
    value: dict[str, Any]
    created_at: datetime | None = None
    updated_at: datetime | None = None
    score: float | None = None


def create_thread(
    definition_id: str | None = None,
    *,
    definition_name: str | None = None,
    metadata: dict[str, str] | None = None,
    state: dict[str, Any] | None = None,
    on_active: OnActive = "reject",
) -> Op[Thread]:
    """Start a conversation with an agent definition (by id, or the newest version of a name)."""
    body: dict[str, Any] = {"metadata": metadata or {}, "state": state or {}, "onActive": on_active}
    body.update({"definitionId": definition_id} if definition_id else {"definitionName": definition_name})
    return parse(Thread, (yield Request("POST", _path("threads"), json=body)))


def fork_thread(thread_id: str) -> Op[Thread]:
    """A new thread continuing this one's conversation as it is now (same definition and state)."""
    return parse(Thread, (yield Request("POST", _path("threads"), json={"forkOf": thread_id})))


def get_thread(thread_id: str) -> Op[Thread]:
    return parse(Thread, (yield Request("GET", _path("threads", thread_id))))


def list_threads(
    *, metadata: dict[str, str] | None = None, page: int = 1, page_size: int = 20
) -> Op[Page[Thread]]:
    """Newest first; `metadata` keeps the threads that have every pair."""
    params: dict[str, Any] = {"page": page, "pageSize": page_size}
    params.update({f"metadata.{k}": v for k, v in (metadata or {}).items()})
    return parse_page(Thread, (yield Request("GET", _path("threads"), params=params)))


def delete_thread(thread_id: str) -> Op[Thread]:
    """Delete the thread; an active turn is cancelled."""
    return parse(Thread, (yield Request("DELETE", _path("threads", thread_id))))


def send(thread_id: str, content: str, *, on_active: OnActive | None = None) -> Op[SentMessage]:
    """Send a message: a new turn, or (a turn active) what `on_active` says (default: the thread's).
    `reject` while busy raises Conflict (code THREAD_BUSY) naming the active run."""
    body: dict[str, Any] = {"content": content, **({"onActive": on_active} if on_active else {})}
    return parse(SentMessage, (yield Request("POST", _path("threads", thread_id, "messages"), json=body)))


def messages(thread_id: str) -> Op[list[ThreadMessage]]:
    """The conversation in order, each message with its turn's `run_id`."""
    return parse_list(ThreadMessage, (yield Request("GET", _path("threads", thread_id, "messages"))))


def steer(run_id: str, content: str) -> Op[dict[str, Any]]:
    """Send a message into a running run's llm step (taken at its next round boundary)."""
    response = yield Request("POST", _path("workflow-runs", run_id, "messages"), json={"content": content})
    data: dict[str, Any] = response.json()["data"]
    return data


def stream_thread(
    thread_id: str,
    last_event_id: str | None = None,
    *,
    until_run_ends: str | None = None,
    text: bool = False,
) -> StreamOp[Event | TextDelta]:
    """Follow a thread's events across turns (each `Event.workflow_run_id` names its turn), and
    with `text=True` its turns' live text. Resumes where a dropped connection broke. Ends when
    the run `until_run_ends` has ended (else follows until the caller stops iterating)."""
    path = _path("threads", thread_id, "stream")
    last, failures = last_event_id, 0
    while True:
        headers = {"accept": "text/event-stream", **({"Last-Event-ID": last} if last else {})}
        try:
            yield OpenStream(Request("GET", path, headers=headers))
            decoder = SSEDecoder()
            while (line := (yield NEXT_LINE)) is not None:
                message = decoder.feed(line)
                if message is None or not message.data:
                    continue
                if message.event == "llm.text.delta":
                    if text:
                        yield Emit(TextDelta.model_validate_json(message.data))
                    continue
                if message.event == "tool.progress":
                    continue
                event = Event.model_validate_json(message.data)
                last, failures = f"{event.workflow_run_id}:{event.sequence}", 0
                yield Emit(event)
                if event.workflow_run_id == until_run_ends and event.event_type in TERMINAL_EVENTS:
                    return
        except StevoraConnectionError:
            failures += 1
            if failures > _RECONNECTS:
                raise
            yield Sleep(min(0.25 * 2**failures, 5.0))
            continue
        return  # the server ended the stream: the thread was deleted


def _ns(namespace: list[str] | tuple[str, ...] | str) -> str:
    return namespace if isinstance(namespace, str) else ".".join(namespace)


def store_put(namespace: list[str] | tuple[str, ...] | str, key: str, value: dict[str, Any]) -> Op[StoreItem]:
    """Write a document (a JSON object) under `namespace` (segments, or joined with `.`) and `key`."""
    return parse(
        StoreItem, (yield Request("PUT", _path("store", _ns(namespace), key), json={"value": value}))
    )


def store_get(namespace: list[str] | tuple[str, ...] | str, key: str) -> Op[StoreItem]:
    """A document; NotFound when there is none."""
    return parse(StoreItem, (yield Request("GET", _path("store", _ns(namespace), key))))


def store_delete(namespace: list[str] | tuple[str, ...] | str, key: str) -> Op[StoreItem]:
    return parse(StoreItem, (yield Request("DELETE", _path("store", _ns(namespace), key))))


def store_search(
    namespace: list[str] | tuple[str, ...] | str, query: str | None = None, *, limit: int = 10, page: int = 1
) -> Op[Page[StoreItem]]:
    """Documents under the namespace matching `query` (full-text), best first; newest first without."""
    params: dict[str, Any] = {"pageSize": limit, "page": page, **({"q": query} if query else {})}
    return parse_page(StoreItem, (yield Request("GET", _path("store", _ns(namespace)), params=params)))
