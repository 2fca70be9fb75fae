#!/usr/bin/env bash
# Set up .venv and run the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/dyngen demo "$@"
