"""Create a fork in a process of its own (as the API would), so a test can SIGKILL it half way
through the fork's transaction (`STEVORA_FAULT_INJECTION=fork_writing`).

    python -m tests.e2e.fork_proc WORKSPACE RUN AT IDEMPOTENCY_KEY EDITS_JSON

Prints `{"id": ..., "created": ...}`. Reads the database and broker from STEVORA_* like a worker.
"""

from __future__ import annotations

import asyncio
import json
import sys

from stevora.engine import fork as forking
from stevora.engine.brokers import build_broker
from stevora.engine.dispatch import DramatiqDispatcher
from stevora.runtime import Runtime
from stevora.settings import Settings


async def main(workspace_id: str, run_id: str, at: str, key: str, edits: str) -> None:
    settings = Settings()
    broker = build_broker(settings.broker_url)
    rt = await Runtime.start(settings, dispatcher=DramatiqDispatcher(broker, settings.queue_name))
    try:
        plan = await forking.plan_fork(rt, workspace_id, run_id, at, json.loads(edits))
        fork, created = await forking.create_fork(rt, plan, plan.origin["definition_id"], key)
        print(json.dumps({"id": fork["id"], "created": created}), flush=True)
    finally:
        await rt.close()
        broker.close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
