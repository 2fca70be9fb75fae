#!/usr/bin/env bash
# Set up $VENV (default .venv) with the base package only, then run the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --base
exec "${VENV:-.venv}/bin/dyngen" demo "$@"
