"""Fixtures for the UI browser tests: the UI served by uvicorn in the test's loop, an API key to
log in with, and headless Chromium (Debian's package, driven by Playwright) with screenshots
saved under test-artifacts/screenshots/.

Kept out of tests/e2e/conftest.py (shared with the crash tests) so neither side can clobber the
other; test_ui_browser.py binds these fixtures into its own namespace.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI

from stevora.ids import new_id, random_token
from stevora.ui import build_ui_router, mount_static
from tests.conftest import Harness

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOT_DIR = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"


def _chromium_path() -> str | None:
    configured = os.environ.get("STEVORA_CHROMIUM")
    for candidate in ((configured,) if configured else ()) + CHROMIUM_CANDIDATES:
        if candidate and Path(candidate).exists():
            return candidate
    return shutil.which("chromium")


@pytest.fixture(scope="session")
def chromium_path() -> str:
    path = _chromium_path()
    if path is None:
        message = (
            "Browser tests skipped: no Chromium found (looked at $STEVORA_CHROMIUM, "
            f"{', '.join(CHROMIUM_CANDIDATES)} and `chromium` on PATH). Install one: "
            "`sudo apt-get install chromium` (Debian/Ubuntu), `brew install --cask chromium` (macOS), "
            "or `.venv/bin/playwright install chromium` and set STEVORA_CHROMIUM to the binary it installed."
        )
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture(scope="session")
async def browser(chromium_path: str) -> AsyncIterator[Any]:
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=chromium_path, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            await launched.close()


@dataclass(frozen=True)
class UiServer:
    base_url: str
    api_key: str
    workspace_id: str


async def create_api_key(harness: Harness, workspace_id: str) -> str:
    raw = "stv_" + random_token(32)
    await harness.rt.pool.execute(
        "INSERT INTO api_keys (id, workspace_id, name, key_hash, key_prefix) VALUES ($1, $2, $3, $4, $5)",
        new_id("key"),
        workspace_id,
        "browser tests",
        hashlib.sha256(raw.encode()).hexdigest(),
        raw[:8],
    )
    return raw


@pytest.fixture
async def ui_server(harness: Harness, workspace_id: str) -> AsyncIterator[UiServer]:
    """The UI router on its own FastAPI app (as the API app mounts it), served on a free port."""
    await harness.rt.pool.execute("UPDATE workspaces SET name = 'Acme Support' WHERE id = $1", workspace_id)
    app = FastAPI()
    app.state.runtime = harness.rt
    app.include_router(build_ui_router())
    mount_static(app)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="off", ws="none", timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.02)
    try:
        yield UiServer(f"http://127.0.0.1:{port}", await create_api_key(harness, workspace_id), workspace_id)
    finally:
        server.should_exit = True
        await task
        sock.close()


@pytest.fixture
async def context(browser: Any, ui_server: UiServer) -> AsyncIterator[Any]:
    ctx = await browser.new_context(base_url=ui_server.base_url, viewport={"width": 1280, "height": 900})
    ctx.set_default_timeout(10_000)
    try:
        yield ctx
    finally:
        await ctx.close()


async def login(page: Any, api_key: str, path: str = "/ui/runs") -> None:
    """Visit a page, get sent to the login form, sign in, and land back on the page."""
    await page.goto(path)
    await page.wait_for_url("**/ui/login**")
    await page.fill("input[name=key]", api_key)
    await page.click("button[type=submit]")
    await page.wait_for_url(f"**{path}")


async def screenshot(page: Any, name: str) -> Path:
    SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOT_DIR / f"{name}.png"
    await page.screenshot(path=str(path), full_page=True)
    return path
