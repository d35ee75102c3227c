"""Settings that are secrets, marked where they are declared so that log redaction finds them all.

A field typed `SecretKey` (one key or token) or `SecretsByName` (keys by server name) is redacted
from every log line (`stevora.logging`): a provider's key cannot be left off a list by mistake,
because there is no list to forget.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator


class _Secret:
    """The marker `secret_values` looks for in a field's metadata."""

    def __repr__(self) -> str:
        return "SECRET"


SECRET = _Secret()


def blank_is_unset(value: object) -> object:
    """`docker-compose.yml` passes `""` for a key the host has not set: blank is unset."""
    if isinstance(value, str) and not value.strip():
        return None
    return value


SecretKey = Annotated[str | None, BeforeValidator(blank_is_unset), SECRET]
SecretsByName = Annotated[dict[str, str], SECRET]


def is_secret(model: type[BaseModel], field_name: str) -> bool:
    return any(item is SECRET for item in model.model_fields[field_name].metadata)


def secret_values(settings: BaseModel) -> list[str]:
    """Every value of the fields marked secret (keys by name: the keys), unset ones left out."""
    found: list[str] = []
    for name in type(settings).model_fields:
        if not is_secret(type(settings), name):
            continue
        value = getattr(settings, name)
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, dict):
            found.extend(v for v in value.values() if isinstance(v, str))
    return found
