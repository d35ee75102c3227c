"""HTTP API throughput and latency: run creation under load, and event pages at depth.

    .venv/bin/python -m bench.api [--seconds 10] [--clients 50] [--events 10000] [--log-info]

The API runs under uvicorn on 127.0.0.1 in `--server-processes` child processes sharing the port
(as `stevora api --workers N`; real HTTP, keep-alive connections)
with a Runtime whose dispatcher only records, so runs are created but never executed: this
measures the API, auth, rate limiting and the insert, not the engine. The parent process runs
`--clients` keep-alive connections POSTing `/v1/workflow-runs` (fresh idempotency keys) for
`--seconds`, twice: saturating (each connection sends its next request when the previous one
returns: the throughput ceiling) and paced (each connection waits an exponential think time so the
offered load is about `--rate`/s: latency at the target load). Creates/s and p50/p99 are printed
for both. Load comes from `wrk` when installed (`apt-get install wrk`: a C client that leaves the
two cores to the server and PostgreSQL), else from httpx clients in this process (`--httpx`).

Then one run gets `--events` events inserted with SQL (as the engine writes them: the run's
`event_seq` counter and the rows in one transaction), and page 1 and the last page of
`GET /v1/workflow-runs/{id}/events?pageSize=100` are timed (200 requests each, one at a time).

The server logs at WARNING (`run_created` is INFO, one line per request); `--log-info` keeps it.
Database: a fresh `stevora_bench_api` on the local server (bench/common.py).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import multiprocessing
import os
import secrets
import shutil
import socket
import tempfile
import time

import asyncpg
import httpx

from bench.common import bench_database_url, median, pct
from stevora.db.database import asyncpg_dsn


def _serve(database_url: str, port: int, log_info: bool, rate_limit: int = 0) -> None:
    """Child process: the app on uvicorn with a recording dispatcher."""
    import structlog
    import uvicorn

    from stevora.api import create_app
    from stevora.api.serve import reuse_port_socket
    from stevora.engine.dispatch import RecordingDispatcher
    from stevora.runtime import Runtime
    from stevora.settings import Settings

    if not log_info:
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    settings = Settings(database_url=database_url, broker_url="stub://", rate_limit_per_minute=rate_limit)

    async def main() -> None:
        rt = await Runtime.start(settings, dispatcher=RecordingDispatcher())
        app = create_app(settings, runtime=rt)
        config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
        try:
            # Several of these processes share the port, as `stevora api --workers N` does.
            await uvicorn.Server(config).serve(sockets=[reuse_port_socket("127.0.0.1", port)])
        finally:
            await rt.close()

    asyncio.run(main())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def _wait_up(url: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(base_url=url) as client:
        while True:
            try:
                if (await client.get("/health")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("API did not start")
            await asyncio.sleep(0.1)


async def _setup(url: str) -> tuple[dict[str, str], str]:
    """A workspace, its first key (bootstrap) and a one-step definition."""
    async with httpx.AsyncClient(base_url=url) as client:
        slug = f"bench-{secrets.token_hex(4)}"
        ws = (await client.post("/v1/workspaces", json={"name": "bench", "slug": slug})).json()["data"]
        key = await client.post("/v1/api-keys", json={"name": "bench", "workspaceId": ws["id"]})
        headers = {"x-api-key": key.json()["data"]["key"]}
        body = {"name": "bench", "version": "1", "steps": [{"type": "task", "name": "a", "handler": "noop"}]}
        definition = await client.post("/v1/workflow-definitions", json=body, headers=headers)
        definition.raise_for_status()
        return headers, definition.json()["data"]["id"]


async def _create_load(
    url: str, headers: dict[str, str], definition_id: str, clients: int, seconds: float
) -> tuple[list[float], int, float]:
    """(latencies in ms, errors, elapsed s) of `clients` loops creating runs for `seconds`."""
    latencies: list[float] = []
    errors = 0
    stop_at = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal errors
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as client:
            while time.perf_counter() < stop_at:
                body = {
                    "definitionId": definition_id,
                    "input": {"n": 1},
                    "idempotencyKey": secrets.token_hex(8),
                }
                started = time.perf_counter()
                response = await client.post("/v1/workflow-runs", json=body)
                latencies.append((time.perf_counter() - started) * 1000)
                if response.status_code != 201:
                    errors += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    return latencies, errors, time.perf_counter() - started


async def _deep_run(
    database_url: str, url: str, headers: dict[str, str], definition_id: str, events: int
) -> str:
    async with httpx.AsyncClient(base_url=url, headers=headers) as client:
        run = await client.post("/v1/workflow-runs", json={"definitionId": definition_id})
        run_id: str = run.json()["data"]["id"]
    conn = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        async with conn.transaction():
            last = await conn.fetchval(
                "UPDATE workflow_runs SET event_seq = event_seq + $2 WHERE id = $1 RETURNING event_seq",
                run_id,
                events,
            )
            await conn.execute(
                "INSERT INTO workflow_events (id, workflow_run_id, step_run_id, sequence, event_type, "
                "payload) SELECT 'evt_' || substr(md5($1 || s), 1, 24), $1, NULL, s, 'STEP_COMPLETED', "
                "jsonb_build_object('stepName', 'a', 'durationMs', s % 100) "
                "FROM generate_series($2::int, $3::int) AS s",
                run_id,
                last - events + 1,
                last,
            )
        await conn.execute("ANALYZE workflow_events")
    finally:
        await conn.close()
    return run_id


async def _page_latency(url: str, headers: dict[str, str], path: str, n: int = 200) -> list[float]:
    out = []
    async with httpx.AsyncClient(base_url=url, headers=headers) as client:
        for _ in range(10):  # warm up (connection, plan cache)
            (await client.get(path)).raise_for_status()
        for _ in range(n):
            started = time.perf_counter()
            response = await client.get(path)
            out.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200 and len(response.json()["data"]) > 0
    return out


_WRK_SCRIPT = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["x-api-key"] = "%(key)s"
counter = 0
request = function()
  counter = counter + 1
  local key = string.format("%%d-%%d", math.random(1, 1e12), counter)
  return wrk.format(nil, "/v1/workflow-runs", nil,
    '{"definitionId": "%(definition)s", "input": {"n": 1}, "idempotencyKey": "' .. key .. '"}')
end
%(delay)s
response = function(status, headers, body)
  if status ~= 201 then errors = (errors or 0) + 1 end
end
done = function(summary, latency, requests)
  io.write(string.format("WRK %%d %%f %%f %%f %%d\\n", summary.requests, summary.duration / 1e6,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    summary.errors.status + summary.errors.connect + summary.errors.read + summary.errors.timeout))
end
"""


async def _wrk_load(
    url: str, headers: dict[str, str], definition_id: str, clients: int, seconds: float, think_ms: float = 0.0
) -> str:
    """Drive the load with wrk (C, one thread): the Python server gets the cores, not the client."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        delay = (
            f"delay = function() return -math.log(1 - math.random()) * {think_ms:.3f} end" if think_ms else ""
        )
        script.write(_WRK_SCRIPT % {"key": headers["x-api-key"], "definition": definition_id, "delay": delay})
    proc = await asyncio.create_subprocess_exec(
        "wrk", "-t1", f"-c{clients}", f"-d{seconds:.0f}s", "-s", script.name, url,
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await proc.communicate()
    os.unlink(script.name)
    line = next(x for x in out.decode().splitlines() if x.startswith("WRK "))
    requests, elapsed, p50, p99, errors = line.split()[1:]
    return (
        f"  creates/s     {int(requests) / float(elapsed):8.0f}   ({requests} requests, {errors} errors; load: wrk)\n"
        f"  latency ms    p50 {float(p50):6.2f}   p99 {float(p99):6.2f}"
    )


async def _bench(database_url: str, url: str, args: argparse.Namespace) -> None:
    await _wait_up(url)
    headers, definition_id = await _setup(url)
    await _create_load(url, headers, definition_id, args.clients, min(2.0, args.seconds))  # warm-up
    print(f"run creation: {args.clients} concurrent clients x {args.seconds:.0f} s over HTTP")
    if shutil.which("wrk") and not args.httpx:
        print(await _wrk_load(url, headers, definition_id, args.clients, args.seconds))
    else:
        latencies, errors, elapsed = await _create_load(
            url, headers, definition_id, args.clients, args.seconds
        )
        print(
            f"  creates/s     {len(latencies) / elapsed:8.0f}   ({len(latencies)} requests, {errors} non-201; "
            "load: httpx in this process — install wrk for a load generator that leaves the cores to the server)"
        )
        print(f"  latency ms    p50 {median(latencies):6.2f}   p99 {pct(latencies, 99):6.2f}")

    if shutil.which("wrk") and not args.httpx:
        think_ms = 1000 * args.clients / args.rate
        print(
            f"run creation at an offered ~{args.rate:.0f}/s ({args.clients} connections, each waiting an "
            f"exponential think time of mean {think_ms:.0f} ms between requests)"
        )
        print(await _wrk_load(url, headers, definition_id, args.clients, args.seconds, think_ms=think_ms))

    run_id = await _deep_run(database_url, url, headers, definition_id, args.events)
    last_page = (args.events + 99) // 100
    base = f"/v1/workflow-runs/{run_id}/events?pageSize=100"
    first = await _page_latency(url, headers, f"{base}&page=1")
    deep = await _page_latency(url, headers, f"{base}&page={last_page}")
    print(f"events pages of a run with {args.events} events (pageSize 100, sequential requests)")
    print(f"  page 1        p50 {median(first):6.2f} ms   p99 {pct(first, 99):6.2f} ms")
    print(f"  page {last_page:<8} p50 {median(deep):6.2f} ms   p99 {pct(deep, 99):6.2f} ms")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--log-info", action="store_true", help="keep the server's INFO logs")
    parser.add_argument(
        "--rate",
        type=float,
        default=525.0,
        help="offered creates/s for the paced part (achieved is a little lower)",
    )
    parser.add_argument(
        "--server-processes", type=int, default=2, help="API processes (default 2, one per core)"
    )
    parser.add_argument(
        "--rate-limit",
        type=int,
        default=0,
        help="STEVORA_RATE_LIMIT_PER_MINUTE for the server (default 0: off; a huge value measures its cost)",
    )
    parser.add_argument(
        "--httpx", action="store_true", help="generate load with httpx even when wrk is installed"
    )
    args = parser.parse_args(argv)
    database_url = bench_database_url("api")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    servers = [
        multiprocessing.get_context("spawn").Process(
            target=_serve, args=(database_url, port, args.log_info, args.rate_limit), daemon=True
        )
        for _ in range(args.server_processes)
    ]
    for server in servers:
        server.start()
    try:
        print(
            f"API: {args.server_processes} uvicorn process(es) on one port (stevora api --workers "
            f"{args.server_processes}), 2 cores shared with PostgreSQL and the load generator"
        )
        asyncio.run(_bench(database_url, url, args))
    finally:
        for server in servers:
            server.terminate()
            server.join(10)


if __name__ == "__main__":
    main()
