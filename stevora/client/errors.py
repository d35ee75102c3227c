"""Exceptions raised by the client, and the mapping from an HTTP error answer to one of them.

Every error the API answers with becomes a `StevoraAPIError` subclass chosen by the envelope's
`code` (then by HTTP status), carrying `.code`, `.status_code`, `.message` and `.details`.
Network failures become `StevoraConnectionError`. All of them are `stevora.errors.StevoraError`s,
so one `except StevoraError` catches everything Stevora raises.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx

from stevora.errors import StevoraError

if TYPE_CHECKING:
    from stevora.client.models import WorkflowRun


class StevoraClientError(StevoraError):
    """Base of everything the client raises."""


class StevoraAPIError(StevoraClientError):
    """The API answered with an error envelope (or a non-2xx status)."""

    def __init__(self, message: str, *, code: str, status_code: int, details: Any = None) -> None:
        super().__init__(message, code=code, details=details, http_status=status_code)
        self.status_code = status_code

    def __str__(self) -> str:
        return f"{self.code} ({self.status_code}): {self.message}"


class ValidationFailed(StevoraAPIError):
    """400: the request body or query was invalid; `details["errors"]` lists `{path, message}`."""

    @property
    def errors(self) -> list[dict[str, str]]:
        found = self.details.get("errors") if isinstance(self.details, dict) else None
        return list(found) if isinstance(found, list) else []


class InvalidToolOutputs(ValidationFailed):
    """400: a tool output names no call the run waits for, or a call already answered differently
    (`details["toolCallId"]` names it). Nothing of the request was recorded."""


class ToolOutputTooLarge(ValidationFailed):
    """400: a tool output is over the server's size cap (`details["bytes"]`, `details["limitBytes"]`)."""


class AuthenticationFailed(StevoraAPIError):
    """401: missing, unknown or revoked API key (or admin token)."""


class NotFound(StevoraAPIError):
    """404: no such resource in the key's workspace."""


class Conflict(StevoraAPIError):
    """409: the request clashes with the current state (duplicate, wrong status, ...)."""


class InvalidStateTransition(Conflict):
    """409: the run or approval is not in a status that allows this action."""


class SignalMismatch(Conflict):
    """409: `resume` sent a signalType the waiting step does not expect."""


class RateLimited(StevoraAPIError):
    """429: the workspace's rate limit; retry after `retry_after_s` seconds."""

    def __init__(
        self, message: str, *, code: str, status_code: int, details: Any = None, retry_after_s: float = 1.0
    ) -> None:
        super().__init__(message, code=code, status_code=status_code, details=details)
        self.retry_after_s = retry_after_s


class ServerError(StevoraAPIError):
    """5xx: the server failed; the request may be retried."""

    retryable = True


class StevoraConnectionError(StevoraClientError):
    """The server could not be reached, or the connection broke."""

    code = "CONNECTION_ERROR"
    retryable = True


class StevoraTimeoutError(StevoraConnectionError):
    """The server did not answer within the client's timeout."""

    code = "TIMEOUT"


class WaitTimeout(StevoraClientError, TimeoutError):
    """`wait_for_completion` gave up; `.run` is the run as last seen (still not terminal)."""

    code = "WAIT_TIMEOUT"

    def __init__(self, run: WorkflowRun, timeout_s: float) -> None:
        super().__init__(
            f"Run {run.id} is still {run.status} after {timeout_s:g} s",
            details={"workflowRunId": run.id, "status": run.status},
        )
        self.run = run
        self.timeout_s = timeout_s


_BY_CODE: dict[str, type[StevoraAPIError]] = {
    "VALIDATION_ERROR": ValidationFailed,
    "INVALID_TOOL_OUTPUTS": InvalidToolOutputs,
    "TOOL_OUTPUT_TOO_LARGE": ToolOutputTooLarge,
    "AUTH_ERROR": AuthenticationFailed,
    "NOT_FOUND": NotFound,
    "CONFLICT": Conflict,
    "INVALID_STATE_TRANSITION": InvalidStateTransition,
    "SIGNAL_MISMATCH": SignalMismatch,
    "RATE_LIMIT_ERROR": RateLimited,
}
_BY_STATUS: dict[int, type[StevoraAPIError]] = {
    400: ValidationFailed,
    401: AuthenticationFailed,
    404: NotFound,
    409: Conflict,
    429: RateLimited,
}


def error_from_response(response: httpx.Response) -> StevoraAPIError:
    """The exception for a non-2xx answer (the body must have been read)."""
    status = response.status_code
    try:
        body = response.json()
    except ValueError:
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        code = str(error.get("code") or f"HTTP_{status}")
        message = str(error.get("message") or response.reason_phrase)
        details = error.get("details")
    else:  # not our envelope: a proxy, a load balancer, a wrong URL
        code, details = f"HTTP_{status}", None
        message = response.text.strip()[:200] or response.reason_phrase
    cls = _BY_CODE.get(code) or _BY_STATUS.get(status) or (ServerError if status >= 500 else StevoraAPIError)
    if cls is RateLimited:
        return RateLimited(
            message,
            code=code,
            status_code=status,
            details=details,
            retry_after_s=_retry_after_s(response, details),
        )
    return cls(message, code=code, status_code=status, details=details)


def _retry_after_s(response: httpx.Response, details: Any) -> float:
    candidates = [response.headers.get("retry-after")]
    if isinstance(details, dict):
        candidates.append(details.get("retryAfterSeconds"))
    for value in candidates:
        try:
            return max(0.0, float(value))
        except (TypeError, ValueError):
            continue
    return 1.0
