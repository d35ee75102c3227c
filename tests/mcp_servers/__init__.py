"""MCP servers the tests run: our own, written with the `mcp` SDK's high-level server (MCPServer,
`counting.py`), and the reference servers nobody here wrote: `mcp-server-time` (PyPI, a test
dependency) and `@modelcontextprotocol/server-filesystem` (npm, installed once into `.mcp-node/`
by `make test` / `make dev`, or by `filesystem_server()` on first use)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from stevora.mcp.config import McpServerConfig

ROOT = Path(__file__).resolve().parents[2]
NODE_PREFIX = ROOT / ".mcp-node"
FILESYSTEM_BIN = NODE_PREFIX / "node_modules" / ".bin" / "mcp-server-filesystem"


def time_server(name: str = "time") -> McpServerConfig:
    return McpServerConfig(
        name=name, command=sys.executable, args=("-m", "mcp_server_time", "--local-timezone", "UTC")
    )


def filesystem_server(root: Path, name: str = "files") -> McpServerConfig:
    """The npm reference filesystem server, serving `root` (installed once, as the Makefile does)."""
    if not FILESYSTEM_BIN.exists():
        npm = shutil.which("npm")
        assert npm is not None, "the MCP filesystem tests need Node.js and npm (see docs/mcp.md)"
        subprocess.run(
            [
                npm,
                "install",
                "--no-audit",
                "--no-fund",
                "--prefix",
                str(NODE_PREFIX),
                "@modelcontextprotocol/server-filesystem",
            ],
            check=True,
            capture_output=True,
            timeout=600,
        )
    return McpServerConfig(name=name, command=str(FILESYSTEM_BIN), args=(str(root),))


def counting_stdio(call_log: Path, name: str = "count", timeout_ms: int = 30_000) -> McpServerConfig:
    return McpServerConfig(
        name=name,
        command=sys.executable,
        args=("-m", "tests.mcp_servers.counting"),
        env={"MCP_CALL_LOG": str(call_log), "PYTHONPATH": str(ROOT)},
        cwd=str(ROOT),
        timeoutMs=timeout_ms,
    )


def logged_calls(call_log: Path) -> list[dict[str, Any]]:
    """Every call the counting server executed, in order."""
    if not call_log.exists():
        return []
    return [json.loads(line) for line in call_log.read_text().splitlines() if line.strip()]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def counting_http(call_log: Path, port: int | None = None) -> Iterator[str]:
    """The counting server over streamable HTTP; yields its URL once it accepts connections."""
    port = port or free_port()
    env = {**os.environ, "MCP_CALL_LOG": str(call_log), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.mcp_servers.counting", "--http", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert proc.poll() is None, "the counting MCP server exited at start"
                assert time.monotonic() < deadline, "the counting MCP server did not start"
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.kill()
        proc.wait(timeout=10)
