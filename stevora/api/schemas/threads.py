"""Threads, their messages, and messages sent to running runs (docs/threads.md)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from stevora.api.schemas.envelope import ApiIn, ApiOut, Stored, Timestamp

OnActive = Literal["reject", "enqueue", "interrupt", "steer"]
# A message's text: past this, 400 naming `content` (docs/threads.md, "Limits").
MAX_CONTENT_CHARS = 32_000
MAX_METADATA_KEYS = 16

Content = Annotated[str, Field(min_length=1, max_length=MAX_CONTENT_CHARS, examples=["Where is my order?"])]


class ThreadCreate(ApiIn):
    definition_id: str | None = Field(default=None, min_length=1, max_length=40, examples=["wfdef_abc123"])
    definition_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="Instead of `definitionId`: the newest version of the definition of this name.",
    )
    metadata: dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]] = Field(
        default_factory=dict,
        max_length=MAX_METADATA_KEYS,
        description="String pairs to find the thread by (`GET /v1/threads?metadata.<key>=<value>`).",
    )
    state: dict[str, Any] = Field(default_factory=dict, description="The first turn's starting state.")
    on_active: OnActive = Field(
        default="reject", description="What a message does while a turn is active, unless it says."
    )
    fork_of: str | None = Field(
        default=None,
        max_length=40,
        description="Instead of a definition: fork this thread (its definition, metadata, state and "
        "policy; the new thread's first turn continues its conversation as it is now).",
    )


class ThreadOut(ApiOut):
    id: str = Field(examples=["thr_abc123"])
    workspace_id: str
    definition_id: str
    metadata: dict[str, Any]
    state: Annotated[dict[str, Any], Stored]
    on_active: OnActive
    forked_from_run_id: str | None = Field(
        default=None, description="A fork: the origin's turn whose conversation this thread continues."
    )
    active_run_id: str | None = Field(default=None, description="The turn running now, if any.")
    queued_run_ids: list[str] = Field(default_factory=list, description="Enqueued turns, in order.")
    created_at: Timestamp
    updated_at: Timestamp


class MessageIn(ApiIn):
    content: Content
    on_active: OnActive | None = Field(
        default=None, description="What to do if a turn is active (default: the thread's `onActive`)."
    )


class SentOut(ApiOut):
    run_id: str = Field(description="The turn's run (for `steer`: the active run the message goes to).")
    policy: Literal["start", "reject", "enqueue", "interrupt", "steer"]
    message_id: str | None = Field(default=None, description="`steer`: the stored message.")
    interrupted_run_id: str | None = Field(default=None, description="`interrupt`: the run cancelled.")


class ThreadMessageOut(ApiOut):
    role: str = Field(examples=["user"])
    content: Annotated[Any, Stored]
    run_id: str
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    injected_round: int | None = Field(
        default=None, description="A steered message: the round of the run it went into."
    )
    status: str | None = Field(
        default=None,
        description="A steered message: injected, pending, or discarded (the run ended first); "
        "`forked`: inherited from the thread this one was forked from.",
    )


class RunMessageIn(ApiIn):
    content: Content


class RunMessageOut(ApiOut):
    id: str = Field(examples=["rmsg_abc123"])
    workflow_run_id: str
    content: str
    status: str
    created_at: Timestamp
