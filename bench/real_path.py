"""The real path's cost, counted: a model call through the real SDKs, and PostgreSQL's work per round.

    .venv/bin/python -m bench.real_path [--calls 300] [--transcript 20] [--baseline /work/main]
    .venv/bin/python -m bench.real_path --db [--rounds 20] [--concurrency 32] [--runs 96] [--baseline /work/main]
    .venv/bin/python -m bench.real_path --in-flight 2000 [--latency 1] [--baseline /work/main]

**Provider part** (default): Stevora's own adapters (`OpenAIProvider` on Chat Completions and on the
Responses API, `AnthropicProvider` on Messages; `--http` their HTTP stack), built as a worker builds
them, call the local fake server (stevora/testing/fake_llm.py, run in a child process so that its
CPU is not counted) `--calls` times one after the other, streamed and not. The request is the one a
tool loop sends at round `--transcript / 2`: the prompt, then that many assistant tool calls and
tool results, one tool offered; the answer is one tool call (text and usage included). Printed per
SDK and mode: worker CPU µs per call (process CPU clock, measured in a pass of its own:
machine-dependent), Python function calls per call (`sys.setprofile`, as cProfile counts them:
machine-independent), with the calls inside pydantic and inside the SDK's own package apart, and
bytecode instructions executed per call (`sys.settrace` opcode events over 20 calls: the
interpreter's work, most of the CPU, and like the calls the same on a loaded machine).

**Database part** (`--db`): the zero-latency tool loop of bench/tool_loop.py (scripted model,
`noop` tool, real RunPool and driver) at `--concurrency`, `--runs` runs of `--rounds` rounds, and
per round: statements sent (counted on the asyncpg connection), transactions committed, rows
inserted / updated (HOT apart) / deleted and index entries written (from pg_stat_user_tables and
each table's index count: an insert or a non-HOT update writes one entry per index; an upper
bound, as a partial index whose predicate the row fails gets none), WAL bytes
(pg_current_wal_lsn before and after: the whole server's, so other clients of a shared server add
to it; with pg_stat_statements loaded, its per-database `wal_bytes` is printed too, and per
statement its calls, plans, execution and planning ms, shared buffers hit and WAL bytes per round,
the costliest first: planning ms need `pg_stat_statements.track_planning=on`), the growth of the
tables' and indexes' files and the PostgreSQL backends' CPU (/proc/<pid>/stat). The window
opens on warm connections, as a worker's are (every statement prepared and past PostgreSQL's five
custom plans): the table statistics are flushed by one statement on every pool connection a
second after the last write; `--cold` ends the backends instead, as before 2026-11-27 afternoon,
so that the window also pays new connections.

**In flight** (`--in-flight N [--latency 1]`): providers built from settings as a worker builds
them (`STEVORA_MAX_CONCURRENT_RUNS=N`), N calls at once to a server answering after `--latency`
seconds (a small asyncio server with the fake's answers: the threaded fake cannot hold thousands
of connections), twice: the wall time of each wave against the latency, and the connections
each wave opened (counted by the server) — a pool that caps calls in flight shows
as a wall of several latencies, one that keeps too few connections alive as the second wave
opening connections again.

`--baseline DIR` runs the same measurement again with DIR's `stevora` package (e.g. a worktree of
main) first on the import path, and prints both, one after the other in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import subprocess
import sys
import time
from collections import Counter
from typing import Any

SELF = os.path.abspath(__file__)
ROOT = os.path.dirname(os.path.dirname(SELF))
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(SELF):
    sys.path.pop(0)  # run by path (the baseline): bench/mcp.py must not shadow the `mcp` package


# --- the fake server, in its own process ---------------------------------------------------------


def _serve(conn: Any, latency_s: float = 0.0) -> None:
    from stevora.testing.fake_llm import FakeLLMServer, anthropic_tool_use, openai_tool_calls

    try:
        from stevora.testing.fake_responses import responses_tool_calls
    except ImportError:  # a tree before the Responses API (e.g. the pre-issue-35 baseline)
        responses_tool_calls = None  # type: ignore[assignment]

    def respond(body: dict[str, Any]) -> Any:
        usage_o = {"prompt_tokens": 1200, "completion_tokens": 40}
        usage_a = {"input_tokens": 1200, "output_tokens": 40}
        if "input" in body:  # the Responses API
            return responses_tool_calls(
                [("call_1", "lookup", '{"query":"the next thing","limit":5}')],
                model=body["model"],
                usage=usage_a,
            )
        if body.get("model", "").startswith("claude"):
            return anthropic_tool_use(
                [("toolu_1", "lookup", {"query": "the next thing", "limit": 5})],
                text="Looking it up.",
                model=body["model"],
                usage=usage_a,
            )
        return openai_tool_calls(
            [("call_1", "lookup", '{"query":"the next thing","limit":5}')],
            text="Looking it up.",
            model=body["model"],
            usage=usage_o,
        )

    server = FakeLLMServer(responder=respond, latency_s=latency_s)
    conn.send(server.base_url)
    conn.recv()  # until the parent says stop
    server.close()


def serve_many(conn: Any, latency_s: float, rounds: int | None = None, tool: str = "lookup") -> None:
    """A keep-alive HTTP/1.1 server on asyncio answering every call after `latency_s` with the
    fake's bodies: the threaded fake cannot hold thousands of connections on a small machine.
    With `rounds`, an agent: a call of `tool` per round while the request holds fewer than
    `rounds` tool results, then a text answer (what bench/concurrency.py --sdk runs)."""
    from stevora.testing.fake_llm import anthropic_text, anthropic_tool_use, openai_text, openai_tool_calls

    def encoded(answer: Any) -> bytes:
        return json.dumps(answer.body).encode()

    bodies = {
        b"/v1/chat/completions": encoded(
            openai_tool_calls([("call_1", tool, '{"note":"x"}')], usage={"prompt_tokens": 1200})
        ),
        b"/v1/messages": encoded(
            anthropic_tool_use([("toolu_1", tool, {"note": "x"})], usage={"input_tokens": 1200})
        ),
    }
    texts = {
        b"/v1/chat/completions": encoded(openai_text("done", usage={"prompt_tokens": 1200})),
        b"/v1/messages": encoded(anthropic_text("done", usage={"input_tokens": 1200})),
    }

    def answer(path: bytes, request: bytes) -> bytes:
        if rounds is None:
            return bodies[path]
        messages = json.loads(request)["messages"]
        done = sum(
            1
            for m in messages
            if m.get("role") == "tool"
            or (
                isinstance(m.get("content"), list)
                and any(b.get("type") == "tool_result" for b in m["content"])
            )
        )
        if done >= rounds:
            return texts[path]
        body = json.loads(bodies[path])  # each round's call its own id
        if path == b"/v1/messages":
            body["content"][0]["id"] = f"toolu_{done + 1}"
        else:
            body["choices"][0]["message"]["tool_calls"][0]["id"] = f"call_{done + 1}"
        return json.dumps(body).encode()

    opened = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal opened
        opened += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1]
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                request = await reader.readexactly(length)
                await asyncio.sleep(latency_s)
                body = answer(path, request)
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    + f"content-length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=4096)
        conn.send(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
        loop = asyncio.get_running_loop()
        while await loop.run_in_executor(None, conn.recv) == "ports":
            conn.send(opened)
        server.close()

    asyncio.run(main())


# --- the provider part -----------------------------------------------------------------------------


def _request(transcript: int) -> Any:
    from stevora.llm.messages import LlmRequest, Message, ToolCall, ToolSpec

    messages = [
        Message(role="system", content="You are a careful research agent."),
        Message(role="user", content="Find the answer."),
    ]
    for i in range(transcript // 2):
        args = json.dumps({"query": f"step {i} of the search", "limit": 5})
        messages.append(
            Message(role="assistant", content=None, tool_calls=[ToolCall(f"call_{i}", "lookup", args)])
        )
        messages.append(
            Message(
                role="tool",
                content=json.dumps({"rows": [f"row {i}.{k}" for k in range(5)]}),
                tool_call_id=f"call_{i}",
            )
        )
    tool = ToolSpec(
        name="lookup",
        description="Look something up",
        parameters={
            "type": "object",
            "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
            "required": ["query"],
        },
    )
    return LlmRequest(model="", messages=messages, tools=[tool], timeout_s=60.0)


def _area(code: Any) -> str:
    name = code.co_filename
    if "/site-packages/" in name:
        return name.split("/site-packages/", 1)[1].split("/", 1)[0]
    if "/stevora/" in name:
        return "stevora"
    return "stdlib"


class _CallCounter:
    def __init__(self) -> None:
        self.calls = 0
        self.by_area: Counter[str] = Counter()
        self._areas: dict[Any, str] = {}

    def hook(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call" or event == "c_call":
            self.calls += 1
            code = frame.f_code
            area = self._areas.get(code)
            if area is None:
                area = self._areas[code] = _area(code)
            self.by_area[area] += 1


class _OpcodeCounter:
    """Bytecode instructions executed (`sys.settrace` with `f_trace_opcodes`): the interpreter's
    work, which is most of a call's CPU and, unlike a time, the same on a loaded machine."""

    def __init__(self) -> None:
        self.opcodes = 0

    def trace(self, frame: Any, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode":
            self.opcodes += 1
        return self.trace


# Calls traced opcode by opcode (~50 times slower than untraced): enough for a stable count.
_OPCODE_CALLS = 20


async def _hooked(install: Any, hook: Any, n: int, provider: Any, request: Any) -> Any:
    """`n` calls with `hook` installed by `install` (`sys.setprofile` or `sys.settrace`); the last answer."""
    install(hook)
    try:
        for _ in range(n):
            response = await provider.complete(request)
    finally:
        install(None)
    return response


def _built(cls: Any, *args: Any, http: str | None, **kwargs: Any) -> Any:
    """The adapter with `http` (the HTTP stack) when given and the tree takes it (main did not)."""
    if http is not None:
        try:
            return cls(*args, http=http, **kwargs)
        except TypeError:
            pass
    return cls(*args, **kwargs)


def _provider_for(kind: str, stream: bool, base_url: str, http: str | None) -> tuple[Any, str] | None:
    """Stevora's adapter for `kind` (`openai`, `responses`, `anthropic`) as a worker builds it,
    with its model; `None` for `responses` in a tree before the Responses API."""
    from stevora.llm.anthropic_provider import AnthropicProvider
    from stevora.llm.openai_provider import OpenAIProvider

    if kind == "openai":
        return _built(OpenAIProvider, "bench-key", f"{base_url}/v1", stream=stream, http=http), "gpt-4o-mini"
    if kind == "responses":
        try:
            provider = _built(
                OpenAIProvider,
                "bench-key",
                f"{base_url}/v1",
                stream=stream,
                default_api="responses",
                http=http,
            )
        except TypeError:  # a tree before the Responses API: no such rows
            return None
        return provider, "gpt-4o-mini"
    return _built(AnthropicProvider, "bench-key", base_url, stream=stream, http=http), "claude-haiku-4-5"


async def _provider_figures(
    base_url: str, calls: int, transcript: int, http: str | None = None
) -> list[dict[str, Any]]:
    out = []
    for kind in ("openai", "responses", "anthropic"):
        for stream in (False, True):
            built = _provider_for(kind, stream, base_url, http)
            if built is None:
                continue
            provider, model = built
            request = _request(transcript)
            request.model = model
            for _ in range(20):  # warm: connection open, lazy imports, caches
                await provider.complete(request)
            # Timed without the hook (which would slow every call), then counted with it.
            cpu0, t0 = time.process_time(), time.perf_counter()
            for _ in range(calls):
                response = await provider.complete(request)
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
            counter, opcodes = _CallCounter(), _OpcodeCounter()
            response = await _hooked(sys.setprofile, counter.hook, calls, provider, request)
            response = await _hooked(sys.settrace, opcodes.trace, _OPCODE_CALLS, provider, request)
            assert response.tool_calls and response.tool_calls[0].name == "lookup", response
            assert response.usage.input_tokens == 1200, response.usage
            await provider.aclose()
            out.append(
                {
                    "sdk": kind,
                    "stream": stream,
                    "cpu_us": 1e6 * cpu / calls,
                    "wall_us": 1e6 * wall / calls,
                    "calls": counter.calls / calls,
                    "opcodes": opcodes.opcodes / _OPCODE_CALLS,
                    "pydantic": (counter.by_area["pydantic"] + counter.by_area["pydantic_core"]) / calls,
                    "sdk_calls": counter.by_area["openai" if kind == "responses" else kind] / calls,
                    "httpx": (
                        counter.by_area["httpx2"]
                        + counter.by_area["httpcore2"]
                        + counter.by_area["httpx"]
                        + counter.by_area["httpcore"]
                        + counter.by_area["aiohttp"]
                    )
                    / calls,
                    "stevora": counter.by_area["stevora"] / calls,
                }
            )
    return out


async def _in_flight_figures(base_url: str, conn: Any, n: int, latency_s: float) -> list[dict[str, Any]]:
    """`n` calls at once, twice, through providers built as a worker builds them (settings ->
    router): wall time against the latency, and connections the second wave had to open."""
    from stevora.llm.setup import build_router
    from stevora.settings import Settings

    settings = Settings(
        openai_api_key="bench-key",
        openai_base_url=f"{base_url}/v1",
        anthropic_api_key="bench-key",
        anthropic_base_url=base_url,
        max_concurrent_runs=n,
        llm_stream=False,
    )
    router = build_router(settings)
    out = []
    for kind, model in (("openai", "gpt-4o-mini"), ("anthropic", "claude-haiku-4-5")):
        provider: Any = router.get(kind)
        request = _request(4)
        request.model = model
        walls, opened = [], []
        for _ in range(2):
            conn.send("ports")
            before = conn.recv()
            t0 = time.perf_counter()
            await asyncio.gather(*(provider.complete(request) for _ in range(n)))
            walls.append(time.perf_counter() - t0)
            conn.send("ports")
            opened.append(conn.recv() - before)
        await provider.aclose()
        out.append({"sdk": kind, "n": n, "latency": latency_s, "walls": walls, "opened": opened})
    return out


# --- paired passes: CPU per call of two trees, alternated ----------------------------------------


async def _pass_server(base_url: str, calls: int, transcript: int, http: str | None) -> None:
    """A child of `--paired`: for each line `<sdk> <0|1>` on stdin, one timed pass of `calls`
    calls (the adapter built and warmed on first use) and its CPU µs per call on stdout."""
    built: dict[tuple[str, bool], tuple[Any, Any]] = {}
    print("READY", flush=True)
    while line := await asyncio.to_thread(sys.stdin.readline):
        kind, streamed = line.split()
        key = (kind, streamed == "1")
        if key not in built:
            made = _provider_for(kind, key[1], base_url, http)
            if made is None:
                print("CPU none", flush=True)
                continue
            provider, model = made
            request = _request(transcript)
            request.model = model
            for _ in range(20):
                await provider.complete(request)
            built[key] = (provider, request)
        provider, request = built[key]
        cpu0 = time.process_time()
        for _ in range(calls):
            await provider.complete(request)
        print(f"CPU {1e6 * (time.process_time() - cpu0) / calls}", flush=True)
    for provider, _ in built.values():
        await provider.aclose()


def _paired(args: argparse.Namespace) -> None:
    """`--paired N`: this tree and `--baseline`'s, each in a process of its own with its own fake
    server and uvloop (as a worker runs), take turns: per SDK and mode, N passes each, the order
    flipped every pass (ABBA), so that both see the same minutes of a noisy machine. Printed:
    each tree's minimum and median CPU µs per call, and this tree's share of the baseline's,
    as the median of the adjacent pairs' ratios and as the ratio of the minimums."""
    import statistics

    def start(tree: str) -> subprocess.Popen[str]:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.abspath(tree), ROOT])}
        argv = [
            sys.executable,
            SELF,
            "--pass-server",
            "--calls",
            str(args.calls),
            "--transcript",
            str(args.transcript),
        ]
        if args.http:
            argv += ["--http", args.http]
        child = subprocess.Popen(
            argv, env=env, cwd=os.path.abspath(tree), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert child.stdout is not None and child.stdout.readline().strip() == "READY", (
            f"{tree} did not start"
        )
        return child

    def one_pass(child: subprocess.Popen[str], kind: str, stream: bool) -> float | None:
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(f"{kind} {int(stream)}\n")
        child.stdin.flush()
        answer = child.stdout.readline().split()
        return None if answer[1] == "none" else float(answer[1])

    trees = {"baseline": start(args.baseline), "this tree": start(ROOT)}
    print(
        f"\npaired passes of {args.calls} calls, {args.paired} per tree and mode, alternated (ABBA), uvloop"
    )
    print(f"  baseline {args.baseline}; this tree {ROOT}")
    print(
        f"  {'sdk':<10}{'stream':<8}{'baseline min / median':>24}{'this tree min / median':>25}"
        f"{'share: pairs median, of minimums':>36}"
    )
    try:
        for kind in ("openai", "responses", "anthropic"):
            for stream in (False, True):
                cpu: dict[str, list[float]] = {"baseline": [], "this tree": []}
                ratios: list[float] = []
                for i in range(args.paired):
                    order = ["baseline", "this tree"] if i % 2 == 0 else ["this tree", "baseline"]
                    got = {name: one_pass(trees[name], kind, stream) for name in order}
                    base_cpu, our_cpu = got["baseline"], got["this tree"]
                    if base_cpu is None or our_cpu is None:
                        break
                    cpu["baseline"].append(base_cpu)
                    cpu["this tree"].append(our_cpu)
                    ratios.append(our_cpu / base_cpu)
                if not ratios:
                    continue
                base, ours = cpu["baseline"], cpu["this tree"]
                print(
                    f"  {kind:<10}{'yes' if stream else 'no':<8}"
                    f"{min(base):>13.0f} / {statistics.median(base):>6.0f} µs"
                    f"{min(ours):>14.0f} / {statistics.median(ours):>6.0f} µs"
                    f"{statistics.median(ratios):>22.2f}, {min(ours) / min(base):.2f}",
                    flush=True,
                )
    finally:
        for child in trees.values():
            if child.stdin is not None:
                child.stdin.close()
            child.wait(30)


def _print_in_flight(label: str, rows: list[dict[str, Any]]) -> None:
    print(f"\n{label}")
    for r in rows:
        w1, w2 = r["walls"]
        o1, o2 = r["opened"]
        print(
            f"  {r['sdk']:<10} {r['n']} calls at once, latency {r['latency']:g} s: wall {w1:5.2f} s then {w2:5.2f} s "
            f"(ideal {r['latency']:g} s; {100 * r['latency'] / w2:3.0f} % of ideal)   "
            f"connections opened {o1} then {o2}"
        )


def _print_provider(label: str, rows: list[dict[str, Any]]) -> None:
    print(f"\n{label}")
    print(
        f"  {'sdk':<10}{'stream':<8}{'CPU µs/call':>12}{'py calls/call':>15}{'in pydantic':>13}"
        f"{'in the SDK':>12}{'in HTTP':>10}{'in stevora':>12}{'bytecodes/call':>16}"
    )
    for r in rows:
        print(
            f"  {r['sdk']:<10}{'yes' if r['stream'] else 'no':<8}{r['cpu_us']:>12.0f}{r['calls']:>15.0f}"
            f"{r['pydantic']:>13.0f}{r['sdk_calls']:>12.0f}{r['httpx']:>10.0f}{r['stevora']:>12.0f}"
            f"{r.get('opcodes', 0):>16.0f}"
        )


# --- the database part -----------------------------------------------------------------------------


TABLE_STATS = (
    "SELECT s.relname, s.n_tup_ins, s.n_tup_upd, s.n_tup_hot_upd, s.n_tup_del, "
    "(SELECT count(*) FROM pg_index i WHERE i.indrelid = s.relid) AS indexes, "
    "pg_relation_size(s.relid) AS heap_bytes, pg_indexes_size(s.relid) AS index_bytes "
    "FROM pg_stat_user_tables s"
)
STATEMENT_STATS = (
    "SELECT query, calls, wal_bytes, plans, total_exec_time, total_plan_time, shared_blks_hit "
    "FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
)


async def _flush_statistics(pool: Any) -> None:
    """Have every connection of the pool flush its pending table statistics, keeping it open.

    A backend flushes them at the end of a transaction once a second has passed since its last
    flush (PostgreSQL 15's PGSTAT_MIN_INTERVAL), so: wait that second (the group committer gives
    its kept connection back meanwhile), then one statement on every connection at once."""
    await asyncio.sleep(1.2)
    conns = [await pool.acquire() for _ in range(pool.get_size())]
    try:
        await asyncio.gather(*(c.execute("SELECT 1") for c in conns))
    finally:
        for c in conns:
            await pool.release(c)


async def _table_stats(pool: Any, cold: bool) -> dict[str, dict[str, int]]:
    if cold:
        # End every other backend of this database so that its pending statistics are flushed
        # (the window then opens on new connections: see `--cold`).
        await pool.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        await asyncio.sleep(0.3)
    else:
        await _flush_statistics(pool)
    async with pool.acquire() as conn:
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        rows = await conn.fetch(TABLE_STATS)
        db = await conn.fetchrow(
            "SELECT xact_commit, tup_inserted, tup_updated, tup_deleted FROM pg_stat_database WHERE datname = current_database()"
        )
    out = {r["relname"]: dict(r) for r in rows}
    out["__db__"] = dict(db)
    return out


async def _wal_lsn(pool: Any) -> int:
    return int(await pool.fetchval("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn"))


async def _statement_stats(pool: Any) -> dict[str, tuple[float, ...]] | None:
    """Per statement text: (calls, WAL bytes, plans, execution ms, planning ms, shared buffers hit),
    from pg_stat_statements when it is loaded (planning ms needs `pg_stat_statements.track_planning`)."""
    try:
        rows = await pool.fetch(STATEMENT_STATS)
    except Exception:
        return None
    return {
        r["query"]: (
            r["calls"],
            float(r["wal_bytes"]),
            r["plans"],
            r["total_exec_time"],
            r["total_plan_time"],
            r["shared_blks_hit"],
        )
        for r in rows
    }


def _by_statement(
    before: dict[str, tuple[float, ...]], after: dict[str, tuple[float, ...]], rounds: int
) -> list[tuple[float, ...]]:
    """Each statement's share of the window per round: (calls, WAL bytes, plans, execution ms,
    planning ms, buffers hit, text), the costliest (execution + planning) first."""
    zero = (0, 0.0, 0, 0.0, 0.0, 0)
    out = []
    for q, figures in after.items():
        d = [(a - b) / rounds for a, b in zip(figures, before.get(q, zero), strict=True)]
        if d[0] > 0:
            out.append((*d, q))
    return sorted(out, key=lambda t: -(t[3] + t[4]))


async def _db_figures(
    url: str, rounds: int, concurrency: int, runs: int, cold: bool = False
) -> dict[str, Any]:
    from bench.counts import Probe
    from bench.harness import LoopBench

    bench = await LoopBench.start(url, hot_pool_size=20)
    try:
        try:
            await bench.rt.pool.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            await bench.rt.pool.fetchval("SELECT count(*) FROM pg_stat_statements")
        except Exception:
            pass
        await bench.level(5, 8, 16)  # warm up: pools grown, statements prepared
        if not cold:
            # A worker's connections live for hours: every statement prepared on every connection
            # and past PostgreSQL's five custom plans (its plan cache's rule) before the window.
            await bench.level(5, concurrency, 8 * concurrency)
        ids = await bench.create_runs(rounds, runs)
        # The counted window (the probe's statement counter only: no function-call hook).
        probe = Probe()
        before = await _table_stats(bench.rt.pool, cold)
        wal0, stats0 = await _wal_lsn(bench.rt.pool), await _statement_stats(bench.rt.pool)
        probe._hook = lambda *a: None  # type: ignore[method-assign]
        bench.probe = probe
        wall, cpu, db_cpu = await bench.execute(ids, concurrency)
        bench.probe = None
        wal1, stats1 = await _wal_lsn(bench.rt.pool), await _statement_stats(bench.rt.pool)
        after = await _table_stats(bench.rt.pool, cold)
    finally:
        await bench.close()
    total_rounds = rounds * runs
    ins = upd = hot = dele = entries = heap_bytes = index_bytes = 0
    per_table: dict[str, tuple[float, float, float]] = {}
    for name, a in after.items():
        if name == "__db__":
            continue
        b = before.get(name, {"n_tup_ins": 0, "n_tup_upd": 0, "n_tup_hot_upd": 0, "n_tup_del": 0})
        di, du, dh, dd = (a[k] - b[k] for k in ("n_tup_ins", "n_tup_upd", "n_tup_hot_upd", "n_tup_del"))
        ins, upd, hot, dele = ins + di, upd + du, hot + dh, dele + dd
        e = (di + du - dh) * a["indexes"]
        entries += e
        grown = a["index_bytes"] - b.get("index_bytes", 0)
        heap_bytes += a["heap_bytes"] - b.get("heap_bytes", 0)
        index_bytes += grown
        if di or du or dd:
            per_table[name] = ((di + du + dd) / total_rounds, e / total_rounds, grown / total_rounds)
    dbb, dba = before["__db__"], after["__db__"]
    return {
        "rounds": total_rounds,
        "statements": probe.counts.statements / total_rounds,
        "commits_client": probe.counts.commits / total_rounds,
        "xact": (dba["xact_commit"] - dbb["xact_commit"]) / total_rounds,
        "inserted": ins / total_rounds,
        "updated": upd / total_rounds,
        "hot": hot / total_rounds,
        "deleted": dele / total_rounds,
        "index_entries": entries / total_rounds,
        "wal_bytes": (wal1 - wal0) / total_rounds,
        "heap_bytes": heap_bytes / total_rounds,
        "index_bytes": index_bytes / total_rounds,
        "stmt_wal_bytes": None
        if stats0 is None or stats1 is None
        else sum(f[1] for f in stats1.values()) / total_rounds
        - sum(f[1] for f in stats0.values()) / total_rounds,
        "by_statement": []
        if stats0 is None or stats1 is None
        else _by_statement(stats0, stats1, total_rounds)[:8],
        "db_cpu_ms": 1000 * db_cpu / total_rounds,
        "worker_cpu_ms": 1000 * cpu / total_rounds,
        "rounds_per_s": total_rounds / wall,
        "per_table": per_table,
    }


def _print_db(label: str, r: dict[str, Any], concurrency: int) -> None:
    print(f"\n{label}: {r['rounds']} rounds at concurrency {concurrency}, per round:")
    swal = "" if r["stmt_wal_bytes"] is None else f" (pg_stat_statements: {r['stmt_wal_bytes']:.0f})"
    print(
        f"  statements {r['statements']:.2f}   commits {r['commits_client']:.2f} (server xact {r['xact']:.2f})   "
        f"rows inserted {r['inserted']:.2f} updated {r['updated']:.2f} (HOT {r['hot']:.2f}) deleted {r['deleted']:.2f}"
    )
    print(
        f"  index entries {r['index_entries']:.2f}   WAL bytes {r['wal_bytes']:.0f}{swal}   "
        f"PostgreSQL CPU {r['db_cpu_ms']:.3f} ms   worker CPU {r['worker_cpu_ms']:.3f} ms   {r['rounds_per_s']:.0f} rounds/s"
    )
    print(f"  heap bytes {r['heap_bytes']:.0f}   index bytes {r['index_bytes']:.0f} (growth of the files)")
    for name, (rows, entries, grown) in sorted(r["per_table"].items(), key=lambda kv: -kv[1][1]):
        print(f"    {name:<28} rows {rows:6.2f}   index entries {entries:6.2f}   index bytes {grown:6.0f}")
    if r.get("by_statement"):
        print("  per statement (pg_stat_statements, per round; the costliest first):")
        print(
            f"    {'calls':>6} {'plans':>6} {'exec ms':>8} {'plan ms':>8} {'buffers':>8} {'WAL B':>6}  statement"
        )
    for calls, wal, plans, exec_ms, plan_ms, hit, query in r.get("by_statement", []):
        text = " ".join(query.split())
        print(
            f"    {calls:6.3f} {plans:6.3f} {exec_ms:8.4f} {plan_ms:8.4f} {hit:8.1f} {wal:6.0f}  {text[:80]}"
        )


# --- driver ----------------------------------------------------------------------------------------


def _measure(args: argparse.Namespace) -> dict[str, Any]:
    if args.db:
        from bench.common import bench_database_url

        url = bench_database_url("real_path")
        return {"db": asyncio.run(_db_figures(url, args.rounds, args.concurrency, args.runs, args.cold))}
    parent, child = multiprocessing.Pipe()
    latency = args.latency if args.in_flight else 0.0
    target = serve_many if args.in_flight else _serve
    server = multiprocessing.get_context("spawn").Process(target=target, args=(child, latency), daemon=True)
    server.start()
    try:
        base_url = parent.recv()
        if args.in_flight:
            return {"in_flight": asyncio.run(_in_flight_figures(base_url, parent, args.in_flight, latency))}
        return {"provider": asyncio.run(_provider_figures(base_url, args.calls, args.transcript, args.http))}
    finally:
        parent.send("stop")
        server.join(5)


def _serve_passes(args: argparse.Namespace) -> None:
    """A `--paired` child: its own fake server, uvloop as in a worker, then `_pass_server`."""
    parent, child = multiprocessing.Pipe()
    server = multiprocessing.get_context("spawn").Process(target=_serve, args=(child, 0.0), daemon=True)
    server.start()
    try:
        base_url = parent.recv()
        try:
            import uvloop

            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        except ImportError:
            pass
        asyncio.run(_pass_server(base_url, args.calls, args.transcript, args.http))
    finally:
        parent.send("stop")
        server.join(5)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--transcript", type=int, default=20, help="messages after the prompt")
    parser.add_argument("--db", action="store_true", help="PostgreSQL's work per round instead")
    parser.add_argument(
        "--cold",
        action="store_true",
        help="with --db: flush statistics by ending the backends before the window, as before (the window "
        "then pays new connections: catalog caches, statements prepared, custom plans)",
    )
    parser.add_argument("--in-flight", type=int, default=0, help="N calls at once instead (see above)")
    parser.add_argument("--latency", type=float, default=1.0, help="the model's latency with --in-flight")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--runs", type=int, default=96)
    parser.add_argument("--baseline", help="a tree whose stevora package is measured first")
    parser.add_argument(
        "--http",
        choices=["aiohttp", "httpx"],
        help="the adapters' HTTP stack (default: theirs; main had httpx only)",
    )
    parser.add_argument(
        "--paired",
        type=int,
        default=0,
        help="with --baseline: CPU per call only, N passes per tree and mode, the trees alternated",
    )
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # the baseline child
    parser.add_argument("--pass-server", action="store_true", help=argparse.SUPPRESS)  # a --paired child
    args = parser.parse_args()
    if args.pass_server:
        _serve_passes(args)
        return
    if args.paired:
        if not args.baseline:
            raise SystemExit("--paired needs --baseline")
        _paired(args)
        return
    if args.json:
        print("RESULT " + json.dumps(_measure(args)))
        return
    results: list[tuple[str, dict[str, Any]]] = []
    if args.baseline:
        argv = [a for a in sys.argv[1:] if a != "--baseline" and a != args.baseline]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.abspath(args.baseline), ROOT])}
        done = subprocess.run(
            [sys.executable, SELF, *argv, "--json"],
            env=env,
            cwd=os.path.abspath(args.baseline),
            capture_output=True,
            text=True,
        )
        line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            raise SystemExit(f"baseline failed:\n{done.stderr[-3000:]}")
        results.append((f"baseline ({args.baseline})", json.loads(line[7:])))
    results.append((f"this tree ({ROOT})", _measure(args)))
    for label, r in results:
        if "in_flight" in r:
            _print_in_flight(label, r["in_flight"])
        elif "provider" in r:
            _print_provider(label, r["provider"])
        else:
            _print_db(label, r["db"], args.concurrency)


if __name__ == "__main__":
    main()
