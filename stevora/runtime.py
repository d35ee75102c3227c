"""The composition root: one object holding settings, connections, registries, providers and the
dispatcher, passed to everything that needs them (no module globals inside the package)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Protocol

import asyncpg

from stevora.db import definitions as db_definitions
from stevora.db.database import asyncpg_dsn, create_pool
from stevora.db.group_commit import GroupCommitter
from stevora.definitions import WorkflowDefinitionSpec, parse_definition
from stevora.errors import NotFoundError
from stevora.faults import FaultPlan
from stevora.live import LiveHub
from stevora.llm.pricing import Pricing
from stevora.llm.provider import Provider
from stevora.llm.router import ProviderRouter
from stevora.mcp import load_mcp_config
from stevora.mcp.manager import McpClientManager
from stevora.observability import metrics
from stevora.settings import Settings
from stevora.tasks import TaskRegistry, default_task_registry
from stevora.tools import ToolRegistry, default_registry


class Dispatcher(Protocol):
    """Asks a worker to look at a run (a hint: the run row is the truth). Implemented in
    `stevora.engine.dispatch` (Dramatiq by actor name, or a list for tests)."""

    async def dispatch(self, run_id: str, *, delay_ms: int = 0) -> None: ...


class CallLimits(Protocol):
    """Provider rate limits shared by every worker, as the model caller uses them: implemented by
    `stevora.engine.provider_limits.ProviderLimits`, which sits above the runtime's layer."""

    def wrap(self, provider: Provider, model: str, *, fallback: bool) -> Provider: ...


class Recorder(Protocol):
    """This process's recorder of `map` item endings (`stevora.engine.map_recorder`)."""

    def poke(self, parent_run_id: str) -> None: ...

    async def close(self) -> None: ...


class DefinitionCache:
    """Definitions are immutable, so a parsed definition can be cached for the process lifetime."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self._cache: dict[str, tuple[str, WorkflowDefinitionSpec]] = {}

    async def _load(self, definition_id: str) -> tuple[str, WorkflowDefinitionSpec] | None:
        found = self._cache.get(definition_id)
        if found is None:
            row = await db_definitions.get(self.pool, definition_id)
            if row is None:
                return None
            spec = parse_definition(
                {
                    "name": row["name"],
                    "version": row["version"],
                    "description": row["description"],
                    "steps": row["steps"],
                    "inputSchema": row["input_schema"],
                    "defaultParams": row["default_params"],
                    "budget": row["budget"],
                    "concurrency": row["concurrency"],
                    "priority": row["priority"],
                }
            )
            found = self._cache[definition_id] = (row["workspace_id"], spec)
        return found

    async def get(self, definition_id: str) -> WorkflowDefinitionSpec:
        found = await self._load(definition_id)
        if found is None:
            raise NotFoundError(f"Workflow definition {definition_id} not found")
        return found[1]

    async def get_in_workspace(self, workspace_id: str, definition_id: str) -> WorkflowDefinitionSpec | None:
        """The definition if it belongs to the workspace (another workspace's is not found)."""
        found = await self._load(definition_id)
        return found[1] if found is not None and found[0] == workspace_id else None


@dataclass
class Runtime:
    settings: Settings
    pool: asyncpg.Pool  # the process's one pool: the engine's writes, the API's and the UI's reads
    dispatcher: Dispatcher
    providers: ProviderRouter
    tasks: TaskRegistry
    tools: ToolRegistry
    pricing: Pricing
    definitions: DefinitionCache
    committer: GroupCommitter  # the tool loop's checkpoints go through it (group commit)
    # Live text deltas for this process's streams: one LISTEN connection, opened at the first one.
    live: LiveHub
    # Per-provider / per-model semaphores capping concurrent LLM calls in this process.
    llm_limits: dict[str, asyncio.Semaphore] = field(default_factory=dict)
    faults: FaultPlan = field(default_factory=lambda: FaultPlan(None))
    # Made at the first limited call (`stevora.engine.provider_limits.of`): only with STEVORA_RATE_LIMITS.
    provider_limits: CallLimits | None = None
    # This process's MCP sessions (docs/mcp.md): the worker's own servers, workspaces' HTTP ones.
    mcp: McpClientManager = field(default_factory=McpClientManager)
    # Made at the first map item ending this process commits (`stevora.engine.map_recorder.poke`).
    map_recorder: Recorder | None = None

    @classmethod
    async def start(
        cls,
        settings: Settings,
        *,
        dispatcher: Dispatcher,
        providers: ProviderRouter | None = None,
        tasks: TaskRegistry | None = None,
        tools: ToolRegistry | None = None,
    ) -> Runtime:
        from stevora.llm.setup import build_router

        pool = await create_pool(settings.database_url, max_size=settings.hot_pool_size)
        faults = FaultPlan(settings.fault_injection)
        mcp_servers = load_mcp_config(settings.mcp_config) if settings.mcp_config else {}
        return cls(
            settings=settings,
            pool=pool,
            dispatcher=dispatcher,
            providers=providers if providers is not None else build_router(settings),
            tasks=tasks if tasks is not None else default_task_registry,
            tools=tools if tools is not None else default_registry,
            pricing=Pricing(overrides=dict(settings.model_prices)),
            definitions=DefinitionCache(pool),
            committer=GroupCommitter(pool, enabled=settings.group_commit, faults=faults),
            live=LiveHub(asyncpg_dsn(settings.database_url)),
            llm_limits={k: asyncio.Semaphore(v) for k, v in settings.llm_concurrency.items()},
            faults=faults,
            mcp=McpClientManager(
                mcp_servers, on_restart=lambda name: metrics.MCP_RESTARTS.labels(name).inc()
            ),
        )

    async def close(self) -> None:
        if self.map_recorder is not None:
            await self.map_recorder.close()  # each recording in flight is one statement
        await self.committer.drain()  # queued checkpoints are written before the pool goes
        await self.mcp.close()  # stdio servers exit with their sessions
        await self.live.aclose()  # the API's LISTEN connection, when a stream opened it
        await self.providers.aclose()
        await self.pool.close()
