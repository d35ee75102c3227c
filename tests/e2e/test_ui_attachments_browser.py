"""Images on the run page (headless Chromium): a tool's image and an input image are shown inline,
served by hash from an authenticated route that answers only within the workspace."""

from __future__ import annotations

import base64
import hashlib
import struct
import zlib
from typing import Any

import pytest

from stevora import Image
from stevora.attachments import Attachment
from stevora.db import blobs
from stevora.engine import commands
from stevora.ids import new_id
from tests.conftest import Harness, create_definition
from tests.e2e import ui_fixtures
from tests.e2e.ui_fixtures import UiServer, login, screenshot

pytestmark = pytest.mark.browser

chromium_path = ui_fixtures.chromium_path
browser = ui_fixtures.browser
ui_server = ui_fixtures.ui_server
context = ui_fixtures.context


def png(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A real PNG a browser decodes (the run page must show it, not just link it)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


async def test_a_tool_image_and_an_input_image_are_shown_inline_on_the_run_page(
    harness: Harness, workspace_id: str, ui_server: UiServer, context: Any, browser: Any
) -> None:
    shot, photo = png(6, 4, (200, 30, 30)), png(3, 5, (30, 30, 200))

    async def screenshot_tool(url: str) -> Image:
        return Image(shot, media_type="image/png")

    harness.tools.register("take_screenshot", screenshot_tool)
    def_id = await create_definition(harness.rt, workspace_id, {
        "name": "looks", "version": "1",
        "steps": [{
            "type": "llm", "name": "look", "model": "scripted",
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "Describe the photo and the page."},
                {"type": "image", "mediaType": "image/png", "data": "{{input.photo}}"},
            ]}],
            "tools": [{"name": "take_screenshot", "description": "Screenshot a page",
                       "parameters": {"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]}}],
        }],
    })  # fmt: skip
    run, _ = await commands.create_run(
        harness.rt, workspace_id, def_id, {"photo": base64.b64encode(photo).decode()}
    )
    done = await harness.wait_for_status(run["id"], "COMPLETED", "FAILED")
    assert done["status"] == "COMPLETED", done["error"]

    page = await context.new_page()
    await login(page, ui_server.api_key, f"/ui/runs/{run['id']}")
    await page.locator("details.sent summary").first.click()
    images = page.locator("img.attachment-image")
    await images.first.wait_for()
    sources = [await img.get_attribute("src") for img in await images.all()]
    assert sources == [f"/ui/blobs/{hashlib.sha256(b).hexdigest()}" for b in (photo, shot)]
    sizes = [
        await img.evaluate("e => e.complete && [e.naturalWidth, e.naturalHeight]")
        for img in await images.all()
    ]
    assert sizes == [[3, 5], [6, 4]]  # decoded by the browser: the route serves the bytes
    await screenshot(page, "60-run-page-inline-images")

    served = await page.request.get(sources[1])
    assert served.status == 200 and served.headers["content-type"] == "image/png"
    assert await served.body() == shot and "sandbox" in served.headers["content-security-policy"]
    # Another workspace's image, a hash nobody stored and a malformed one are not found.
    other = new_id("ws")
    await harness.rt.pool.execute(
        "INSERT INTO workspaces (id, name, slug) VALUES ($1, $2, $3)", other, "Other", other.replace("_", "-")
    )
    theirs = Attachment.of("image", "image/png", png(2, 2, (0, 0, 0)))
    await blobs.store(harness.rt.pool, other, [theirs])
    assert (await page.request.get(f"/ui/blobs/{theirs.sha256}")).status == 404
    assert (await page.request.get(f"/ui/blobs/{hashlib.sha256(b'other').hexdigest()}")).status == 404
    assert (await page.request.get("/ui/blobs/..%2Fetc")).status == 404
    # Logged out: nothing.
    anonymous = await browser.new_context(base_url=ui_server.base_url)
    try:
        assert (await anonymous.request.get(sources[1])).status == 401
    finally:
        await anonymous.close()
