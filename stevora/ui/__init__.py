"""The web UI served by the API app under /ui (see docs/ui.md)."""

from stevora.ui.routes import build_ui_router, mount_static

__all__ = ["build_ui_router", "mount_static"]
