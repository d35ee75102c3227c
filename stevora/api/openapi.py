"""OpenAPI details FastAPI cannot infer: the error envelope on every status we answer with,
no 422 (validation errors are 400 here), the definition body's JSON Schema, and the rules the
server enforces on every request beyond what the models say: no NUL character in any string,
key or free-form JSON value (`NO_NUL`, `JsonValue`), and a step's `type` always given."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from starlette.responses import Response

from stevora.api.schemas.envelope import ErrorEnvelope
from stevora.definitions import WorkflowDefinitionSpec

_DESCRIPTIONS = {
    400: "VALIDATION_ERROR: invalid body, path or query parameters",
    401: "AUTH_ERROR: missing, invalid or revoked credentials",
    404: "NOT_FOUND: no such resource in the caller's workspace",
    409: "CONFLICT / INVALID_STATE_TRANSITION / SIGNAL_MISMATCH",
    415: "UNSUPPORTED_MEDIA_TYPE: a body that is not one Content-Type: application/json (UTF-8)",
    429: "RATE_LIMIT_ERROR: too many requests (see the Retry-After header)",
    500: "INTERNAL_ERROR",
    503: "SERVICE_UNAVAILABLE",
}
DEFINITION_SCHEMA = "WorkflowDefinitionInput"
DOCS_PAGES = ("/docs", "/redoc")  # Swagger UI and ReDoc (stevora.api.app)
# PostgreSQL text and jsonb cannot hold U+0000; `request_checks.reject_nul` (path, query) and the
# edge (`api.limits`, JSON bodies) answer 400 for one anywhere in a
# request (path, query, body). The document says so on every string a request can carry.
NO_NUL = "^[^\\u0000]*$"
JSON_VALUE = "JsonValue"
_JSON_VALUE_REF = {"$ref": f"#/components/schemas/{JSON_VALUE}"}
JSON_VALUE_SCHEMA: dict[str, Any] = {
    "description": "Any JSON value without a NUL character (U+0000) in a string or object key.",
    "anyOf": [
        {"type": "string", "pattern": NO_NUL},
        {"type": ["number", "boolean", "null"]},
        {"type": "array", "items": _JSON_VALUE_REF},
        {"type": "object", "propertyNames": {"pattern": NO_NUL}, "additionalProperties": _JSON_VALUE_REF},
    ],
}
# Keywords that constrain a value; a schema with none of them accepts any JSON value.
_CONSTRAINING = {
    "type", "$ref", "anyOf", "oneOf", "allOf", "not", "const", "enum", "properties", "items",
    "prefixItems", "if", "then", "else", "additionalProperties", "propertyNames", "required",
    "pattern", "format", "minimum", "maximum", "minLength", "maxLength", "minItems", "maxItems",
    "minProperties", "maxProperties", "contains", "dependentRequired", "multipleOf",
}  # fmt: skip


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
                security = operation.get("security", [])
                if any("AdminToken" in requirement for requirement in security) and {} not in security:
                    # Open when the server has no ADMIN_TOKEN (docs/api/authentication.md): the
                    # token is one way in, not a requirement the schema may promise.
                    security.append({})
                responses = operation.get("responses", {})
                responses.pop("422", None)
                for status, entry in AUTHED.items():
                    if status == 401 and "security" not in operation:
                        continue
                    if status == 429 and "security" not in operation:
                        continue
                    responses.setdefault(str(status), _inline(entry))
                if "requestBody" in operation:  # the edge's one way to read a body (api.limits)
                    responses.setdefault("415", _inline(errors(415)[415]))
        for name in ("HTTPValidationError", "ValidationError"):
            components.pop(name, None)
        _require_discriminators(components)
        components[JSON_VALUE] = JSON_VALUE_SCHEMA
        _forbid_nul_in_requests(schema, components)
        app.openapi_schema = schema
        return schema

    app.openapi = build  # type: ignore[method-assign]

    @app.middleware("http")
    async def docs_load_nothing_from_elsewhere(request: Request, call_next: Any) -> Response:
        """ReDoc's bundle shows a logo from cdn.redoc.ly in its sidebar: on the docs pages the
        browser may load images from this server only (the bundle hides the logo when it fails)."""
        response: Response = await call_next(request)
        if request.url.path in DOCS_PAGES:
            response.headers.setdefault("Content-Security-Policy", "img-src 'self' data:")
        return response


def _inline(entry: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "description": entry["description"],
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorEnvelope"}}},
    }
    if "headers" in entry:
        out["headers"] = entry["headers"]
    return out


def _require_discriminators(components: dict[str, Any]) -> None:
    """A discriminated union's tag must be sent: the server picks the variant by it (a step without
    `type` is refused), though each variant's model gives the tag a default."""
    for schema in list(components.values()):
        for node in _nodes(schema):
            discriminator = node.get("discriminator")
            if not isinstance(discriminator, dict):
                continue
            tag = discriminator["propertyName"]
            for ref in discriminator.get("mapping", {}).values():
                variant = components[ref.rsplit("/", 1)[-1]]
                required = variant.setdefault("required", [])
                if tag not in required:
                    required.insert(0, tag)


def _forbid_nul_in_requests(document: dict[str, Any], components: dict[str, Any]) -> None:
    """Every schema a request can carry (parameters and bodies, and the components they use) says
    that strings and keys hold no NUL, and free-form values are `JsonValue`s."""
    seen: set[str] = set()
    pending: list[dict[str, Any]] = []
    for path_item in document.get("paths", {}).values():
        for operation in path_item.values():
            pending += [p["schema"] for p in operation.get("parameters", []) if "schema" in p]
            for media in operation.get("requestBody", {}).get("content", {}).values():
                if "schema" in media:
                    pending.append(media["schema"])
    while pending:
        schema = pending.pop()
        for node in _nodes(schema):
            ref = node.get("$ref", "")
            if ref.startswith("#/components/schemas/"):
                name = ref.rsplit("/", 1)[-1]
                if name not in seen and name != JSON_VALUE:
                    seen.add(name)
                    pending.append(components[name])
            _no_nul(node)


def _no_nul(node: dict[str, Any]) -> None:
    kinds = node.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    if "string" in kinds and not {"pattern", "enum", "const", "format"} & node.keys():
        node["pattern"] = NO_NUL
    if "object" in kinds and node.get("additionalProperties") is not False:
        node.setdefault("propertyNames", {"pattern": NO_NUL})
        if node.get("additionalProperties") in (None, True) and "properties" not in node:
            node["additionalProperties"] = _JSON_VALUE_REF
    if not _CONSTRAINING & node.keys():  # `Any`: any JSON value
        node["allOf"] = [_JSON_VALUE_REF]


def _nodes(schema: Any) -> list[dict[str, Any]]:
    """`schema` and every subschema in it, without following `$ref`s."""
    out: list[dict[str, Any]] = []
    stack = [schema]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        out.append(node)
        for key in (
            "items",
            "additionalProperties",
            "not",
            "if",
            "then",
            "else",
            "contains",
            "propertyNames",
        ):
            stack.append(node.get(key))
        for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
            stack.extend(node.get(key) or [])
        stack.extend((node.get("properties") or {}).values())
    return out
