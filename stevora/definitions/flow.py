"""Flow control of a workflow's runs: a concurrency key with its limit, and a priority.

    {"concurrency": {"key": "{{input.customerId}}", "limit": 1}, "priority": 5}

The key is a template over the run input, rendered when a run is created; runs with the same
rendered key (in one workspace) share `limit` slots. A run's create request may override the
key, the limit and the priority. How it is enforced: docs/flow-control.md.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, field_validator

from stevora.definitions.retry import CamelModel

MAX_PRIORITY = 1000
MAX_CONCURRENCY_LIMIT = 100_000
_KEY_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z0-9_$.\-]+)\s*\}\}")


class Concurrency(CamelModel):
    key: str = Field(min_length=1, max_length=500, examples=["{{input.customerId}}"])
    """A template over the run input (`{{input.a.b}}` placeholders only), or a fixed string."""
    limit: int = Field(default=1, ge=1, le=MAX_CONCURRENCY_LIMIT)
    """How many runs of one key may be started and unfinished at once."""
    hold_while_waiting: bool = True
    """Whether a WAITING or PAUSED run keeps its slot (true), or lets a queued run of its key
    start and queues again for a slot when it wakes (false)."""

    @field_validator("key")
    @classmethod
    def _input_placeholders_only(cls, key: str) -> str:
        for path in key_paths(key):
            if path[0] != "input" or len(path) < 2:
                raise ValueError(
                    f"a concurrency key may only read the run input ({{{{input.<field>}}}}), not {{{{{'.'.join(path)}}}}}"
                )
        if "{{" in _KEY_PLACEHOLDER.sub("", key):
            raise ValueError("a malformed {{...}} placeholder in the concurrency key")
        return key


def key_paths(key: str) -> list[list[str]]:
    """The placeholder paths of a key template, split on dots (`[["input", "customerId"]]`)."""
    return [m.group(1).split(".") for m in _KEY_PLACEHOLDER.finditer(key)]


def schema_lacks(schema: dict[str, Any], path: list[str]) -> bool:
    """True when an object schema declares its properties and `path` (below `input`) is not
    among them, level by level (a level without declared properties accepts anything)."""
    node: Any = schema
    for seg in path:
        if not isinstance(node, dict):
            return False
        props = node.get("properties")
        if not isinstance(props, dict):
            return False
        if seg not in props:
            return True
        node = props[seg]
    return False
