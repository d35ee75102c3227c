"""Client-executed tool declarations shared by the tests of awaited tool calls (client, CLI, UI)."""

from __future__ import annotations

from typing import Any

WEATHER: dict[str, Any] = {
    "name": "get_weather",
    "description": "Weather in a city (runs in the caller's app)",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "execution": "client",
}
LOCATION: dict[str, Any] = {
    "name": "get_location",
    "description": "The user's location (runs in the caller's browser)",
    "parameters": {"type": "object", "properties": {}},
    "execution": "client",
}
