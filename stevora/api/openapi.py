"""OpenAPI details FastAPI cannot infer: the error envelope on every status we answer with,
no 422 (validation errors are 400 here), and the definition body's JSON Schema."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from stevora.api.schemas.envelope import ErrorEnvelope
from stevora.definitions import WorkflowDefinitionSpec

_DESCRIPTIONS = {
    400: "VALIDATION_ERROR: invalid body, path or query parameters",
    401: "AUTH_ERROR: missing, invalid or revoked credentials",
    404: "NOT_FOUND: no such resource in the caller's workspace",
    409: "CONFLICT / INVALID_STATE_TRANSITION / SIGNAL_MISMATCH",
    429: "RATE_LIMIT_ERROR: too many requests (see the Retry-After header)",
    500: "INTERNAL_ERROR",
    503: "SERVICE_UNAVAILABLE",
}
DEFINITION_SCHEMA = "WorkflowDefinitionInput"


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` entries documenting the error envelope for these statuses."""
    out: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        entry: dict[str, Any] = {"model": ErrorEnvelope, "description": _DESCRIPTIONS[status]}
        if status == 429:
            entry["headers"] = {
                "Retry-After": {
                    "description": "Seconds to wait (integer >= 1).",
                    "schema": {"type": "integer"},
                }
            }
        out[status] = entry
    return out


# Every authenticated operation can answer these, whatever its own errors are.
AUTHED = errors(400, 401, 429, 500)


_DEFINITION_MARK = "x-definition-body"


def definition_body() -> dict[str, Any]:
    """`openapi_extra` for an operation whose JSON body is a workflow definition (validated by
    `parse_definition`, not by FastAPI, so FastAPI only sees a plain object)."""
    return {_DEFINITION_MARK: True}


def install_openapi(app: FastAPI) -> None:
    def build() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        spec = WorkflowDefinitionSpec.model_json_schema(
            by_alias=True, ref_template="#/components/schemas/{model}"
        )
        components.update(spec.pop("$defs", {}))
        components[DEFINITION_SCHEMA] = spec
        for path_item in schema.get("paths", {}).values():
            for operation in path_item.values():
                if operation.pop(_DEFINITION_MARK, False):
                    operation["requestBody"] = {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {"$ref": f"#/components/schemas/{DEFINITION_SCHEMA}"}
                            }
                        },
                    }
                responses = operation.get("responses", {})
                responses.pop("422", None)
                for status, entry in AUTHED.items():
                    if status == 401 and "security" not in operation:
                        continue
                    if status == 429 and "security" not in operation:
                        continue
                    responses.setdefault(str(status), _inline(entry))
        for name in ("HTTPValidationError", "ValidationError"):
            components.pop(name, None)
        app.openapi_schema = schema
        return schema

    app.openapi = build  # type: ignore[method-assign]


def _inline(entry: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "description": entry["description"],
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorEnvelope"}}},
    }
    if "headers" in entry:
        out["headers"] = entry["headers"]
    return out
