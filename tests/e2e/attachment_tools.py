"""A tool for the process tests of images and files: a screenshot as a `stevora.Image`."""

from __future__ import annotations

import stevora

# A 1x1 PNG (the bytes a browser would decode).
PIXEL = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6364f8cf00000203010095d2f2c20000000049454e44ae426082"
)


@stevora.tool
async def screenshot(url: str) -> list[object]:
    """A screenshot of the page at `url`."""
    return [f"Screenshot of {url}", stevora.Image(PIXEL, media_type="image/png")]
