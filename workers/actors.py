"""Actors take ids only and are safe to run twice: the claim in PostgreSQL decides who runs."""

from __future__ import annotations

from typing import Any

import dramatiq

from stevora.engine.dispatch import EXECUTE_RUN_ACTOR
from workers import edge


def declare_actors(broker: dramatiq.Broker, queue_name: str) -> dict[str, dramatiq.Actor[Any, Any]]:
    @dramatiq.actor(broker=broker, actor_name=EXECUTE_RUN_ACTOR, queue_name=queue_name, max_retries=5)
    async def execute_run(run_id: str) -> None:
        # Returns once the run is claimed (or found not ours); the run continues as a task.
        await edge.current().run_pool.submit(run_id)

    return {EXECUTE_RUN_ACTOR: execute_run}
