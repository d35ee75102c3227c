"""The interop server is built to run on any x86-64 machine with AVX2, not just the one that built it.

llama.cpp's default build is `-march=native`: on a machine whose CPU reports AVX-512 that its sandbox
cannot execute, the server died with an invalid-opcode trap on its first request. install.sh builds a
fixed level (AVX2 + FMA + F16C) and records the flags; these tests hold it to that, and check that a
server that dies is reported with its signal and the tail of its log.
"""

from __future__ import annotations

import platform
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.interop.conftest import VENV, LlamaServer, _venv_ready

# Enabled instruction sets beyond AVX2 (what the build must not switch on unconditionally).
BEYOND_AVX2 = ("AVX512", "AVX_VNNI", "AMX")


def _build_flags() -> dict[str, str]:
    path = VENV / "stevora-build-flags.txt"
    if not _venv_ready() or not path.exists():
        subprocess.run(["bash", str(Path(__file__).with_name("install.sh"))], check=True)
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64 instruction levels")
def test_recorded_build_flags_enable_nothing_beyond_avx2() -> None:
    flags = _build_flags()
    cmake_args = dict(
        re.fullmatch(r"-D(\w+)=(\w+)", arg).groups()  # type: ignore[union-attr]
        for arg in flags["CMAKE_ARGS"].split()
    )
    assert cmake_args["GGML_NATIVE"] == "OFF"  # no -march=native
    assert cmake_args["GGML_AVX2"] == "ON"
    enabled_beyond = [
        name
        for name, value in cmake_args.items()
        if value == "ON" and name.startswith(tuple(f"GGML_{isa}" for isa in BEYOND_AVX2))
    ]
    assert enabled_beyond == []
    assert Path(flags["WHEEL"]).parent.name.endswith(flags["FLAGS_KEY"])  # the cache is keyed by the flags


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64 instruction levels")
@pytest.mark.skipif(shutil.which("objdump") is None, reason="needs binutils' objdump")
def test_the_built_cpu_library_contains_no_avx512_instructions() -> None:
    """What the compiler emitted, not only what we asked for: no zmm (AVX-512) register anywhere."""
    _build_flags()
    libraries = sorted(VENV.glob("lib/python*/site-packages/llama_cpp/lib/libggml-cpu*.so"))
    assert libraries, "libggml-cpu not found in the interop venv"
    for library in libraries:
        disassembly = subprocess.run(
            ["objdump", "-d", "--no-show-raw-insn", str(library)], capture_output=True, text=True, check=True
        ).stdout
        assert "%zmm" not in disassembly, f"{library.name} uses AVX-512 registers"
        assert "%ymm" in disassembly  # and it is vectorised with AVX2, not built for a baseline CPU


def test_a_server_that_dies_is_reported_with_its_signal_and_log_tail(tmp_path: Path) -> None:
    log_path = tmp_path / "server.log"
    script = (
        "import os, signal, sys; print('loading model', flush=True); "
        "print('ggml: illegal instruction ahead', flush=True); os.kill(os.getpid(), signal.SIGILL)"
    )
    with log_path.open("w") as log:
        process = subprocess.Popen([sys.executable, "-c", script], stdout=log, stderr=subprocess.STDOUT)
        process.wait(timeout=30)
    died = LlamaServer(process, "http://127.0.0.1:1/v1", log_path).death()
    assert died is not None
    assert f"killed by SIGILL (signal {int(signal.SIGILL)})" in died
    assert "ggml: illegal instruction ahead" in died
