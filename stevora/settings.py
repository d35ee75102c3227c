"""One settings object, read from the environment once and passed around explicitly.

Every variable is prefixed `STEVORA_` except the ones users already set for other tools: the
providers' keys and base URLs, `ADMIN_TOKEN`. The providers' settings are declared by the
providers (stevora/llm/providers/) and are fields of this object through `ProviderSettings`.
The full table is in docs/configuration.md.
"""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from stevora.llm.providers import ProviderSettings
from stevora.secrets import SecretKey


class ProviderRateLimit(BaseModel):
    """One model's limits per `rate_limit_window_s` (a minute by default): requests and tokens."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rpm: int | None = Field(default=None, ge=1)
    """Requests per window; None: not limited."""
    tpm: int | None = Field(default=None, ge=1)
    """Tokens per window (prompt and answer); None: not limited."""


class Settings(BaseSettings, ProviderSettings):
    model_config = SettingsConfigDict(env_prefix="STEVORA_", extra="ignore", populate_by_name=True)

    # Storage and messaging
    database_url: str = "postgresql+asyncpg://postgres@127.0.0.1:5432/stevora"
    broker_url: str = "amqp://guest:guest@127.0.0.1:5672/"
    queue_name: str = "stevora"
    hot_pool_size: int = 10  # the process's one asyncpg pool (engine, API and UI)
    # Concurrent runs' checkpoints share one statement and one commit (stevora/db/group_commit.py).
    group_commit: bool = True

    # API
    host: str = "127.0.0.1"
    port: int = 3000
    admin_token: SecretKey = Field(
        default=None, validation_alias=AliasChoices("ADMIN_TOKEN", "STEVORA_ADMIN_TOKEN")
    )
    rate_limit_per_minute: int = 6000  # per workspace, API and UI together; 0 disables
    # Failed authentications (unknown, revoked or malformed keys, wrong admin tokens; API and UI)
    # per client address and minute before it gets 429 without a lookup; 0 disables.
    auth_failures_per_minute: int = Field(default=60, ge=0)
    cors_origins: list[str] = []
    # Longest `?wait=` / `Prefer: wait=` a run request may hold its answer for (0: never waits).
    max_request_wait_s: float = Field(default=60.0, ge=0, le=600)

    # Input limits, checked before anything is written (docs/security.md, "Input limits").
    max_request_bytes: int = Field(default=2_097_152, ge=1024)  # any request body, chunked too
    max_json_depth: int = Field(default=64, ge=4, le=200)  # nesting of any stored JSON value
    max_definition_bytes: int = Field(default=1_048_576, ge=1024)
    max_run_input_bytes: int = Field(default=524_288, ge=64)
    max_signal_payload_bytes: int = Field(default=524_288, ge=64)
    max_state_bytes: int = Field(default=2_097_152, ge=1024)  # a run's state after any merge
    # A run list page: input, state and output larger than their share are left out of the items.
    max_list_page_bytes: int = Field(default=2_097_152, ge=10_240)

    # Worker
    worker_processes: int = 1
    worker_threads: int = 8
    tool_modules: list[str] = []  # imported at worker start so register_tool / @tool calls run
    max_concurrent_runs: int = 2000  # runs one worker process executes at once (async tasks)
    lease_s: float = 30.0
    heartbeat_s: float = 10.0
    sweep_interval_s: float = 5.0
    undispatched_grace_s: float = 5.0  # PENDING runs older than this with no lease get re-dispatched
    # Consecutive driver crashes or lease takeovers after which a run FAILS with RUN_CRASH_LIMIT.
    max_run_crashes: int = Field(default=5, ge=1)
    # Delete finished runs this many days after they ended (`stevora runs prune`; the recovery
    # sweep prunes periodically when set). None or 0: keep everything.
    retention_days: int | None = Field(default=None, ge=0)
    # Triggers (docs/triggers.md): how often each worker looks for due schedule ticks and
    # debounce / batch groups, and the most events one POST /v1/events or one hook body may carry.
    trigger_poll_s: float = Field(default=0.5, gt=0, le=60)
    max_event_batch: int = Field(default=100, ge=1, le=10_000)
    max_hook_body_bytes: int = Field(default=1_048_576, ge=1024)

    # LLM (each provider's own settings, keys included, come with `ProviderSettings`)
    # Per-provider or per-model caps on concurrent calls in one process: {"openai": 200, "gpt-4o": 50}.
    llm_concurrency: dict[str, int] = {}
    # Provider rate limits shared by every worker (docs/flow-control.md, "Provider rate limits"):
    # {"openai:gpt-4o-mini": {"rpm": 600, "tpm": 100000}}, keyed "provider:model", a model name
    # or a provider name; per `rate_limit_window_s` seconds.
    rate_limits: dict[str, ProviderRateLimit] = {}
    rate_limit_window_s: float = Field(default=60.0, gt=0)
    # A call whose turn is further away than this tries the step's next fallback model instead.
    rate_limit_fallback_after_s: float = Field(default=10.0, ge=0)
    # The longest a worker waits inline for a call's turn; beyond it (and no fallback within its
    # bound) the attempt fails with a retryable RATE_LIMITED, retried no earlier than its turn.
    rate_limit_max_wait_s: float = Field(default=60.0, ge=0)
    # A step visit deferred this many times (RATE_LIMITED, not sent) fails instead of waiting for
    # another turn: about two hours at the default wait bound under an overload that never ends.
    rate_limit_max_deferrals: int = Field(default=120, ge=1)
    # Price overrides in USD per million tokens: {"my-model": [input, output]}.
    model_prices: dict[str, tuple[float, float]] = {}
    max_tool_output_bytes: int = 100_000
    # Images and files (docs/providers.md, "Images and files"): the largest one attachment may be,
    # and the most bytes of distinct attachments one run's input and one llm step's conversation
    # may hold.
    max_attachment_bytes: int = Field(default=10 * 1024 * 1024, ge=1)
    max_run_attachment_bytes: int = Field(default=50 * 1024 * 1024, ge=1)
    # Workflows called as tools: a root run is depth 1; a call that would go deeper fails at once.
    max_workflow_depth: int = Field(default=5, ge=1, le=50)
    # The most items one `map` step may fan out over; more fails the step (MAP_TOO_MANY_ITEMS).
    map_max_items: int = Field(default=10_000, ge=1, le=1_000_000)
    # The most `maxToolRounds` an `llm` step may ask for; more is refused when a definition is stored.
    max_tool_rounds: int = Field(default=500, ge=1, le=10_000)
    # The ceiling of every run's budget (docs/definitions.md#budgets): a run asking for more is
    # refused at create (400); a run asking for nothing, or a definition default above it, gets it.
    # None: no ceiling.
    max_run_cost_cents: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    max_run_model_calls: int | None = Field(default=None, ge=0)
    max_run_tool_calls: int | None = Field(default=None, ge=0)
    # Flow control (docs/flow-control.md): how many runs of one workspace may be started and
    # unfinished at once (runs created while it is set queue for a slot). None or 0: no limit.
    workspace_max_running: int | None = Field(default=None, ge=0)

    # MCP (docs/mcp.md): the worker's own MCP servers, an `{"mcpServers": {...}}` JSON file
    # (`stevora worker --mcp-config FILE`); workspaces' registered HTTP servers may be on loopback
    # or private addresses only with mcp_allow_private (local development; SSRF risk).
    mcp_config: str | None = None
    mcp_allow_private: bool = False

    # Webhooks
    webhook_max_attempts: int = 8
    webhook_timeout_s: float = 10.0
    # Deliver to private, loopback and link-local addresses too (local development; SSRF risk).
    webhook_allow_private: bool = False
    # Webhooks one workspace may have (a 409 past it); each has its own cap of pending deliveries
    # (docs/api/webhooks.md, "Limits").
    webhooks_per_workspace: int = Field(default=25, ge=1)

    # Observability (docs/observability.md)
    # OpenTelemetry traces: on when an OTLP endpoint is set or STEVORA_OTEL=true (needs stevora[otel]).
    otel: bool = False
    otel_exporter_otlp_endpoint: str | None = Field(
        default=None,
        validation_alias=AliasChoices("OTEL_EXPORTER_OTLP_ENDPOINT", "STEVORA_OTEL_EXPORTER_OTLP_ENDPOINT"),
    )
    # Put prompts, answers and tool arguments/results on spans (off: only ids, models, tokens).
    otel_capture_content: bool = False
    # Workers serve Prometheus metrics on this port (0: no metrics server).
    metrics_port: int = 0
    # When set, the API's /metrics and the workers' metrics port answer only
    # `Authorization: Bearer <token>` (401 otherwise). Unset: /metrics is open.
    metrics_token: SecretKey = None
    # One log line per HTTP request from the API.
    access_log: bool = False

    # Misc
    log_format: Literal["auto", "json", "console"] = "auto"
    log_level: str = "INFO"
    data_dir: str = ".stevora"  # embedded mode: PostgreSQL data and state live here

    # Test-only crash points (see stevora/faults.py). Never set in production.
    fault_injection: str | None = None
