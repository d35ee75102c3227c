"""Swagger UI and ReDoc are served with their assets from this server (no CDN)."""

from __future__ import annotations

import re

import httpx
import pytest


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
async def test_api_docs_pages_load_every_asset_from_this_server(client: httpx.AsyncClient, page: str) -> None:
    response = await client.get(page)
    assert response.status_code == 200
    html = response.text
    assets = re.findall(r"""(?:src|href|spec-url)=["']([^"']+)["']""", html) + re.findall(
        r"url: ?'([^']+)'", html
    )
    assert assets, html
    for url in assets:
        assert url.startswith("/"), f"{page} loads {url} from another host"
        if url.endswith((".js", ".css", ".json")):
            asset = await client.get(url)
            assert asset.status_code == 200, url
            assert len(asset.content) > 100, url
    assert "cdn" not in html.lower() and "fonts.googleapis" not in html
