"""One router per resource; `stevora.api.app` mounts them under /v1 (and /api/v1)."""
