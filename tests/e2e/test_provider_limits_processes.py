"""Provider rate limits shared by real worker processes: two workers calling one model under one
limit never exceed it, counted from the enforcing fake provider's request log (its buckets are the
provider's: a call beyond them is answered 429)."""

from __future__ import annotations

import asyncio
import json

import pytest

from stevora.engine import commands
from stevora.testing.fake_llm import FakeLLMServer, openai_text
from stevora.testing.fake_rate_limit import FakeRateLimit
from tests.conftest import create_definition
from tests.e2e.conftest import BrokerSetup
from tests.e2e.workerproc import WorkerProcess

RUNS, RPM, WINDOW_S = 40, 10, 4.0  # 2.5 calls a second after a burst of ten


@pytest.mark.broker
async def test_two_worker_processes_sharing_one_limit_never_exceed_it(broker_setup: BrokerSetup) -> None:
    setup = broker_setup
    model = f"gpt-shared-{setup.queue}"
    with FakeLLMServer(responder=lambda _body: openai_text("ok", model=model)) as fake:
        fake.rate_limit = FakeRateLimit(requests=RPM, tokens=10_000_000, window_s=WINDOW_S)
        def_id = await create_definition(
            setup.rt,
            setup.workspace_id,
            {
                "name": "shared-limit",
                "version": "1",
                "steps": [
                    {
                        "type": "llm",
                        "name": "ask",
                        "model": model,
                        "messages": [{"role": "user", "content": "hi {{input.i}}"}],
                    }
                ],
            },
        )
        ids = [
            (await commands.create_run(setup.rt, setup.workspace_id, def_id, {"i": i}))[0]["id"]
            for i in range(RUNS)
        ]
        env = {
            "OPENAI_API_KEY": "test",
            "OPENAI_BASE_URL": fake.openai_base_url,
            "STEVORA_LLM_STREAM": "false",
            "STEVORA_RATE_LIMITS": json.dumps({f"openai:{model}": {"rpm": RPM}}),
            "STEVORA_RATE_LIMIT_WINDOW_S": str(WINDOW_S),
            "STEVORA_LEASE_S": "10",
            "STEVORA_HEARTBEAT_S": "1",
        }
        db, url, queue = setup.rt.settings.database_url, setup.url, setup.queue
        workers = [WorkerProcess(db, url, queue, extra_env=env) for _ in range(2)]
        try:
            deadline = asyncio.get_running_loop().time() + 90
            while True:
                left = await setup.rt.pool.fetchval(
                    "SELECT count(*) FROM workflow_runs WHERE id = ANY($1::text[]) AND status <> 'COMPLETED'",
                    ids,
                )
                if left == 0:
                    break
                if asyncio.get_running_loop().time() > deadline:
                    logs = "\n".join(w.log_tail() for w in workers)
                    raise AssertionError(f"{left} runs not completed; worker logs:\n{logs}")
                await asyncio.sleep(0.2)
        finally:
            for w in workers:
                w.stop()
        log = list(fake.rate_limit.log)
    assert fake.rate_limit.refused == 0, [d.status for d in log]
    assert len(log) == RUNS
    # And the limit was what held them back: 30 calls beyond the burst at 2.5 a second.
    assert log[-1].at - log[0].at >= (RUNS - RPM) / (RPM / WINDOW_S) * 0.8
