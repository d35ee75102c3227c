"""CLI test fixtures: the API on a real uvicorn server, and a way to invoke the CLI against it.

`CliRunner` swaps `sys.stdout`/`sys.stderr` while a command runs, and it runs in a thread here
(the server and the harness Runtime live on the test's event loop). Engine logs are pinned to
the streams of the test itself so they neither land in a command's output nor outlive it.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import structlog
from click.testing import Result
from typer.testing import CliRunner

import stevora.cli.prompt
import stevora.cli.remote
import stevora.cli.run_commands
import stevora.cli.trigger_commands  # noqa: F401
from stevora.api.app import create_app
from stevora.cli import app
from stevora.settings import Settings
from tests.integration.client.live_server import insert_api_key, serve


@dataclass
class Cli:
    url: str
    api_key: str

    async def __call__(
        self, *args: str, env: dict[str, str | None] | None = None, input: str | None = None
    ) -> Result:
        """Run `stevora <args>` with STEVORA_URL / STEVORA_API_KEY pointing at the test server."""
        environ = {
            "STEVORA_URL": self.url,
            "STEVORA_API_KEY": self.api_key,
            "STEVORA_API_KEY_FILE": "",  # never a developer's .stevora/dev-api-key
            **(env or {}),
        }
        return await asyncio.to_thread(CliRunner().invoke, app, list(args), env=environ, input=input)


@pytest.fixture(autouse=True)
def logs_outside_the_runner() -> Iterator[None]:
    saved = structlog.get_config()
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=sys.stderr))
    try:
        yield
    finally:
        structlog.configure(**saved)


@pytest.fixture
async def api_key(harness: Any, workspace_id: str) -> str:
    return await insert_api_key(harness.rt, workspace_id)


@pytest.fixture
async def cli(harness: Any, settings: Settings, api_key: str) -> AsyncIterator[Cli]:
    async with serve(create_app(settings, runtime=harness.rt)) as url:
        yield Cli(url, api_key)
