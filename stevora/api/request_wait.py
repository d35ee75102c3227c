"""Bounded waits of the run routes: `?wait=N` or `Prefer: wait=N` holds the answer until the run
is *settled* — COMPLETED, FAILED, CANCELLED, PAUSED, or WAITING with a `requiredAction` (client
tool outputs to send) — or until N seconds (capped by `STEVORA_MAX_REQUEST_WAIT_S`) have passed.

No database connection is held while waiting: the run is looked at with one short indexed read
(status, and whether a client call is pending), then the request sleeps, with a backoff from
`FIRST_POLL_S` doubling to `MAX_POLL_S`. Workers do not announce run status changes (the live
channel carries only text deltas), so a poll is the cheapest honest signal: a 30 s wait on a run
that never settles costs ~65 reads of one row; one that settles is answered within `MAX_POLL_S`.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Header, Query, Request
from starlette.responses import Response

from stevora.api.deps import Ctx
from stevora.db.reads import runs as run_reads
from stevora.runtime import Runtime
from stevora.statuses import TERMINAL_RUN_STATUSES, RunStatus

FIRST_POLL_S = 0.02
MAX_POLL_S = 0.5
SETTLED = frozenset({*TERMINAL_RUN_STATUSES, RunStatus.PAUSED})
_PREFER_WAIT = re.compile(r"(?:^|[,;\s])wait\s*=\s*\"?([^\s,;\"]*)\"?", re.IGNORECASE)


def requested_wait(query: float | None, prefer: str | None, cap_s: float) -> float | None:
    """The wait the caller asked for (`?wait=` wins over `Prefer: wait=`), capped; None: no wait.

    A `Prefer` header is a preference (RFC 7240): an unreadable one is ignored, not refused."""
    wanted = query
    if wanted is None and prefer:
        match = _PREFER_WAIT.search(prefer)
        if match:
            try:
                wanted = float(match.group(1))
            except ValueError:
                wanted = None
            if wanted is not None and not wanted >= 0:  # negative or NaN
                wanted = None
    if wanted is None:
        return None
    return min(wanted, cap_s)


async def is_settled(rt: Runtime, workspace_id: str, run_id: str) -> bool:
    """One read: is the run settled (or gone, which the caller's load then reports as 404)?"""
    found = await run_reads.settling(rt.pool, workspace_id, run_id)
    if found is None:
        return True
    status, action = found
    return status in SETTLED or (status == RunStatus.WAITING and action)


async def wait_until_settled(
    rt: Runtime,
    workspace_id: str,
    run_id: str,
    seconds: float,
    disconnected: Callable[[], Awaitable[bool]] | None = None,
) -> bool:
    """Poll (with backoff) until the run is settled or `seconds` have passed; True if settled.
    Stops early, unsettled, when the caller has gone away."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    delay = FIRST_POLL_S
    while True:
        if await is_settled(rt, workspace_id, run_id):
            return True
        left = deadline - loop.time()
        if left <= 0 or (disconnected is not None and await disconnected()):
            return False
        await asyncio.sleep(min(delay, left))
        delay = min(delay * 2, MAX_POLL_S)


@dataclass(frozen=True, slots=True)
class Wait:
    seconds: float
    preferred: bool  # asked for with `Prefer` (answered with `Preference-Applied`)


async def requested(
    ctx: Ctx,
    request: Request,
    wait: Annotated[
        float | None,
        Query(
            ge=0,
            description="Hold the answer up to this many seconds (capped by STEVORA_MAX_REQUEST_WAIT_S) "
            "until the run completes, fails, is cancelled or paused, or requires action "
            "(`requiredAction`); then, or at the bound, answer with the run as it is.",
        ),
    ] = None,
    prefer: Annotated[
        str | None, Header(alias="Prefer", description="`wait=N`: as `?wait=N` (RFC 7240).")
    ] = None,
) -> Wait | None:
    seconds = requested_wait(wait, prefer, ctx.settings.max_request_wait_s)
    if not seconds:
        return None
    return Wait(seconds, preferred=wait is None)


RequestedWait = Annotated[Wait | None, Depends(requested)]


async def settle(rt: Runtime, request: Request, workspace_id: str, run_id: str, wait: Wait | None) -> None:
    """Hold the request for `wait` (if any) until the run is settled."""
    if wait is not None:
        await wait_until_settled(rt, workspace_id, run_id, wait.seconds, request.is_disconnected)


def applied(response: Response, wait: Wait | None) -> Response:
    """Name the wait honoured when it came as a preference (RFC 7240 `Preference-Applied`)."""
    if wait is not None and wait.preferred:
        response.headers["Preference-Applied"] = f"wait={wait.seconds:g}"
    return response
