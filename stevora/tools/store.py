"""`ctx.store`: a tool's view of the workspace's memory store (docs/threads.md, "Memory store").

JSON documents under a namespace (a tuple of segments, `("users", "u_42")`) and a key. Reads go
to the store as committed, overlaid with this call's own writes. Writes are buffered here and
applied by the engine in the transaction that commits the call's trace row: a call that fails
writes nothing, and a call that ran but was not committed (a crash) and runs again writes once.
`search` is PostgreSQL full-text search over the documents' string values (committed documents,
with this call's writes overlaid), under the namespace and the namespaces below it.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

SEGMENT = re.compile(r"^[A-Za-z0-9_:@-]{1,64}$")
MAX_KEY_CHARS = 200
MAX_DEPTH = 8  # namespace segments
MAX_VALUE_BYTES = 64 * 1024
MAX_SEARCH_LIMIT = 100


@dataclass(frozen=True, slots=True)
class StoreItem:
    namespace: tuple[str, ...]
    key: str
    value: dict[str, Any]
    updated_at: datetime | None = None
    score: float | None = None  # a search's rank


class StoreBackend(Protocol):
    """Where committed documents are read (the engine binds it to the database and workspace)."""

    async def get(self, namespace: str, key: str) -> StoreItem | None: ...

    async def search(self, namespace: str, query: str, limit: int) -> list[StoreItem]: ...


def namespace_path(namespace: Sequence[str] | str) -> str:
    """The stored form (`users.u_42`), checked: 1-8 segments of letters, digits, `_:@-`."""
    parts = namespace.split(".") if isinstance(namespace, str) else list(namespace)
    if not 1 <= len(parts) <= MAX_DEPTH or not all(isinstance(p, str) and SEGMENT.match(p) for p in parts):
        raise ValueError(
            f"a store namespace is 1-{MAX_DEPTH} segments of 1-64 letters, digits or _:@- ; got {namespace!r}"
        )
    return ".".join(parts)


def check_key(key: str) -> str:
    if not isinstance(key, str) or not 1 <= len(key) <= MAX_KEY_CHARS or "\x00" in key:
        raise ValueError(f"a store key is a string of 1-{MAX_KEY_CHARS} characters; got {key!r}")
    return key


def check_value(value: Any) -> dict[str, Any]:
    """A document: a JSON object of at most 64 KB."""
    if not isinstance(value, dict):
        raise ValueError("a store value is a JSON object (a dict)")
    try:
        size = len(json.dumps(value, ensure_ascii=False, allow_nan=False).encode())
    except (TypeError, ValueError) as exc:
        raise ValueError(f"a store value must be JSON: {exc}") from None
    if size > MAX_VALUE_BYTES:
        raise ValueError(f"a store value is {size} bytes, over the {MAX_VALUE_BYTES}-byte limit")
    return value


_DELETED: Any = object()


class ToolStore:
    """One tool call's store: committed reads, buffered writes (see the module)."""

    def __init__(self, backend: StoreBackend) -> None:
        self._backend = backend
        self._writes: dict[tuple[str, str], Any] = {}

    async def put(self, namespace: Sequence[str] | str, key: str, value: dict[str, Any]) -> None:
        self._writes[(namespace_path(namespace), check_key(key))] = json.loads(json.dumps(check_value(value)))

    async def get(self, namespace: Sequence[str] | str, key: str) -> dict[str, Any] | None:
        ns, key = namespace_path(namespace), check_key(key)
        written = self._writes.get((ns, key))
        if written is not None:
            return None if written is _DELETED else dict(written)
        item = await self._backend.get(ns, key)
        return None if item is None else item.value

    async def delete(self, namespace: Sequence[str] | str, key: str) -> None:
        self._writes[(namespace_path(namespace), check_key(key))] = _DELETED

    async def search(self, namespace: Sequence[str] | str, query: str, limit: int = 10) -> list[StoreItem]:
        ns = namespace_path(namespace)
        limit = max(1, min(int(limit), MAX_SEARCH_LIMIT))
        found = await self._backend.search(ns, str(query), limit)
        # Overlay this call's writes on what is committed: deleted or rewritten documents.
        out = []
        for item in found:
            written = self._writes.get((".".join(item.namespace), item.key))
            if written is _DELETED:
                continue
            out.append(item if written is None else dataclasses.replace(item, value=written))
        return out

    @property
    def writes(self) -> list[tuple[str, str, dict[str, Any] | None]]:
        """(namespace, key, value or None for a delete), in the order first written."""
        return [(ns, key, None if v is _DELETED else v) for (ns, key), v in self._writes.items()]
