"""The HTTP API: FastAPI app factory, one router per resource, auth, and the error envelope."""

from stevora.api.app import create_app

__all__ = ["create_app"]
