"""A first `make test` compiles llama.cpp for the interop suite: the README says so, and the
build prints its progress instead of staying silent for 10 minutes."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROGRESS = ROOT / "tests" / "interop" / "progress.sh"


def _with_progress(tmp_path: Path, command: str) -> subprocess.CompletedProcess[str]:
    script = (
        f'set -euo pipefail; source "{PROGRESS}"; with_progress "{tmp_path}/build.log" bash -c "{command}"'
    )
    return subprocess.run(
        ["bash", "-c", script],
        capture_output=True,
        text=True,
        env={"PROGRESS_EVERY": "1", "PATH": "/usr/bin:/bin"},
    )


def test_a_long_build_prints_its_elapsed_time_and_last_log_line(tmp_path: Path) -> None:
    done = _with_progress(tmp_path, "echo compiling ggml.c; sleep 2.5; echo linked")
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if "still compiling llama.cpp" in line]
    assert len(lines) >= 2 and "compiling ggml.c" in lines[0], done.stdout
    assert (tmp_path / "build.log").read_text().splitlines() == ["compiling ggml.c", "linked"]


def test_a_failed_build_keeps_its_exit_status_and_shows_the_log_tail(tmp_path: Path) -> None:
    failed = _with_progress(tmp_path, "echo cc1: fatal error; exit 3")
    assert failed.returncode == 3
    assert "llama.cpp build failed (exit 3)" in failed.stderr and "cc1: fatal error" in failed.stderr


def test_install_sh_builds_through_the_progress_helper_and_the_readme_warns() -> None:
    install = (ROOT / "tests" / "interop" / "install.sh").read_text()
    assert "source tests/interop/progress.sh" in install
    assert 'with_progress "$BUILD_LOG" "$VENV/bin/pip" wheel' in install
    readme = (ROOT / "README.md").read_text()
    assert "compiles llama.cpp" in readme and "STEVORA_SKIP_INTEROP=1" in readme
