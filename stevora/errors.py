"""The one error tree. Every error Stevora raises on purpose is a `StevoraError`.

Each class carries the wire `code`, the HTTP status the API answers with and whether the
failure is worth retrying. Driver and SDK exceptions are translated into these where they
enter (provider adapters, repositories); one FastAPI handler turns them into the envelope.
"""

from __future__ import annotations

from typing import Any


class StevoraError(Exception):
    code: str = "INTERNAL_ERROR"
    http_status: int = 500
    retryable: bool = False

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        details: Any = None,
        retryable: bool | None = None,
        http_status: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if retryable is not None:
            self.retryable = retryable
        if http_status is not None:
            self.http_status = http_status
        self.details = details

    def to_dict(self) -> dict[str, Any]:
        """The `{code, message, details}` shape used in envelopes, events and step errors."""
        out: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details is not None:
            out["details"] = self.details
        return out


class ValidationError(StevoraError):
    """Bad input. `details` is `{"errors": [{"path": "steps[1].name", "message": ...}]}`."""

    code = "VALIDATION_ERROR"
    http_status = 400

    @classmethod
    def from_problems(cls, problems: list[dict[str, str]], message: str | None = None) -> ValidationError:
        if message is None:
            message = "; ".join(
                f"{p['path']}: {p['message']}" if p["path"] else p["message"] for p in problems
            )
        return cls(message, details={"errors": problems})

    @classmethod
    def at(cls, path: str, message: str) -> ValidationError:
        """One problem at one field path."""
        return cls.from_problems([{"path": path, "message": message}])


class AuthError(StevoraError):
    code = "AUTH_ERROR"
    http_status = 401


class NotFoundError(StevoraError):
    code = "NOT_FOUND"
    http_status = 404


class ConflictError(StevoraError):
    code = "CONFLICT"
    http_status = 409


class InvalidStateTransition(StevoraError):
    """The run (or approval) is not in a status that allows the requested action."""

    code = "INVALID_STATE_TRANSITION"
    http_status = 409


class RateLimitError(StevoraError):
    code = "RATE_LIMIT_ERROR"
    http_status = 429

    def __init__(self, message: str = "Too many requests", *, retry_after_s: float = 1.0) -> None:
        super().__init__(message, details={"retryAfterSeconds": retry_after_s})
        self.retry_after_s = retry_after_s


class StepError(StevoraError):
    """A step failed. Retryable step errors are retried under the step's RetryPolicy."""

    code = "STEP_FAILED"
    retryable = True


class ProviderError(StepError):
    """An LLM provider call failed. 429/5xx/529/timeouts are retryable; 400/401/404 are not."""

    code = "LLM_PROVIDER_ERROR"

    def __init__(
        self,
        message: str,
        *,
        provider: str,
        status_code: int | None = None,
        retryable: bool = False,
        retry_after_s: float | None = None,
        code: str | None = None,
        remaining: tuple[float | None, float | None] = (None, None),
    ) -> None:
        super().__init__(
            message,
            code=code,
            retryable=retryable,
            details={"provider": provider, "statusCode": status_code, "retryAfterSeconds": retry_after_s},
        )
        self.provider = provider
        self.status_code = status_code
        self.retry_after_s = retry_after_s
        # (requests, tokens) the provider's rate-limit headers said remain, when it said.
        self.remaining = remaining


class ProviderNotFound(StepError):
    code = "PROVIDER_NOT_FOUND"
    retryable = False


class ContextExpired(StepError):
    """A run waited longer than `outputsExpireAfterMs` for client tool outputs nobody sent."""

    code = "CONTEXT_EXPIRED"
    retryable = False


class BudgetExceeded(StepError):
    """A run reached a limit of its budget (`limit`: maxCostCents, maxModelCalls or maxToolCalls)."""

    code = "BUDGET_EXCEEDED"
    retryable = False

    def __init__(self, limit: str) -> None:
        super().__init__(f"The run reached its {limit} budget", details={"limit": limit})
        self.limit = limit


class LeaseLost(StevoraError):
    """This worker no longer owns the run (lease expired and taken, or the run was cancelled)."""

    code = "LEASE_LOST"


class InvalidToolOutputs(StevoraError):
    """A `tool-outputs` item names no call the run waits for, or one answered differently."""

    code = "INVALID_TOOL_OUTPUTS"
    http_status = 400


class ToolOutputTooLarge(StevoraError):
    code = "TOOL_OUTPUT_TOO_LARGE"
    http_status = 400


class UnstorableValue(ValidationError):
    """JSON Stevora cannot store and read back exactly (docs/security.md, "Numbers"): the code is
    `INVALID_NUMBER`, `JSON_TOO_DEEP` or `INVALID_UNICODE`; `details.errors[0].path` names the field."""

    @classmethod
    def of(cls, code: str, path: str, message: str) -> UnstorableValue:
        return cls(f"{path}: {message}", code=code, details={"errors": [{"path": path, "message": message}]})


class PayloadTooLarge(StevoraError):
    """A request body, or one field of it, over its documented limit (docs/security.md)."""

    code = "PAYLOAD_TOO_LARGE"
    http_status = 413

    @classmethod
    def field(cls, path: str, size: int, limit: int, setting: str) -> PayloadTooLarge:
        message = f"{path} is {size} bytes of JSON, over the {limit}-byte limit ({setting})"
        return cls(
            message,
            details={"errors": [{"path": path, "message": message}], "bytes": size, "limitBytes": limit},
        )


class StateTooLarge(StevoraError):
    """A state merge (signal payload, edited approval content, task or tool state updates) that
    would make the run's state larger than `STEVORA_MAX_STATE_BYTES`; nothing is merged."""

    code = "STATE_TOO_LARGE"
    http_status = 413
    retryable = False


class RunCrashLimit(StevoraError):
    """A run whose driver crashed (or whose worker died holding it) too many times in a row."""

    code = "RUN_CRASH_LIMIT"
