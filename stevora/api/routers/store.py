"""`/v1/store`: the workspace's memory store, the documents tools read and write with `ctx.store`.

The namespace is its segments joined with `.` (`users.u_42`); a search (`?q=`) is PostgreSQL
full-text search over the documents' string values, under the namespace and those below it."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from starlette.responses import Response

from stevora.api.deps import Auth, Ctx, Paging
from stevora.api.openapi import errors
from stevora.api.schemas.envelope import Envelope, Page, ok, page
from stevora.api.schemas.store import StoreItemOut, StorePut
from stevora.db import store as db_store
from stevora.errors import NotFoundError, ValidationError
from stevora.tools.store import check_key, check_value, namespace_path

router = APIRouter(prefix="/store", tags=["store"])
Namespace = Annotated[
    str, Path(description="Namespace segments joined with `.` (users.u_42).", max_length=600)
]
Key = Annotated[str, Path(description="The document's key.", max_length=200)]


def _checked(namespace: str, key: str | None = None) -> tuple[str, str | None]:
    try:
        return namespace_path(namespace), (check_key(key) if key is not None else None)
    except ValueError as exc:
        field = "key" if key is not None and "key" in str(exc) else "namespace"
        raise ValidationError.from_problems([{"path": field, "message": str(exc)}]) from None


def _out(row: Any) -> StoreItemOut:
    data = dict(row)
    return StoreItemOut.model_validate({**data, "namespace": data["namespace"].split(".")})


@router.put(
    "/{namespace}/{key}",
    response_model=Envelope[StoreItemOut],
    responses=errors(400),
    summary="Put a document",
)
async def put_item(namespace: Namespace, key: Key, body: StorePut, auth: Auth, ctx: Ctx) -> Response:
    ns, k = _checked(namespace, key)
    try:
        check_value(body.value)
    except ValueError as exc:
        raise ValidationError.from_problems([{"path": "value", "message": str(exc)}]) from None
    assert k is not None
    return ok(_out(await db_store.put(ctx.rt.pool, auth.workspace_id, ns, k, body.value)))


@router.get(
    "/{namespace}/{key}",
    response_model=Envelope[StoreItemOut],
    responses=errors(400, 404),
    summary="Get a document",
)
async def get_item(namespace: Namespace, key: Key, auth: Auth, ctx: Ctx) -> Response:
    ns, k = _checked(namespace, key)
    assert k is not None
    row = await db_store.get(ctx.rt.pool, auth.workspace_id, ns, k)
    if row is None:
        raise NotFoundError("Store document not found", details={"namespace": ns, "key": k})
    return ok(_out(row))


@router.delete(
    "/{namespace}/{key}",
    response_model=Envelope[StoreItemOut],
    responses=errors(400, 404),
    summary="Delete a document",
)
async def delete_item(namespace: Namespace, key: Key, auth: Auth, ctx: Ctx) -> Response:
    ns, k = _checked(namespace, key)
    assert k is not None
    row = await db_store.delete(ctx.rt.pool, auth.workspace_id, ns, k)
    if row is None:
        raise NotFoundError("Store document not found", details={"namespace": ns, "key": k})
    return ok(_out(row))


@router.get(
    "/{namespace}",
    response_model=Page[StoreItemOut],
    responses=errors(400),
    summary="List or search documents",
)
async def search_items(
    namespace: Namespace,
    auth: Auth,
    ctx: Ctx,
    paging: Paging,
    q: Annotated[
        str | None,
        Query(max_length=500, description='Full-text query (words, "phrases", -word, or); best match first.'),
    ] = None,
) -> Response:
    """The documents under the namespace (and the namespaces below it): matching `q`, best first
    (each with its `score`), or newest first without `q`."""
    ns, _ = _checked(namespace)
    rows, total = await db_store.search(
        ctx.rt.pool, auth.workspace_id, ns, q or None, offset=paging.offset, limit=paging.page_size
    )
    return page([_out(r) for r in rows], page=paging.page, page_size=paging.page_size, total=total)
