#!/usr/bin/env bash
# Set up .venv-verl (scripts/setup-verl.sh: dyngen + verl 0.9.1 on the CPU), then run tests/verl.
#   --no-setup  the environment is ready (CI set it up beside the main suite)
if [ "${1:-}" = --help ] || [ "${1:-}" = -h ]; then  # usage, and nothing done
    echo "usage: bash scripts/test-verl.sh [--no-setup] [PYTEST OPTIONS]"
    sed -n '2,/^[^#]/s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"
    exit 0
fi
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--no-setup" ]; then
    shift
else
    bash scripts/setup-verl.sh
fi
# The code reward's test runs programs in the sandbox (bubblewrap).
bash scripts/system-packages.sh --sandbox
exec .venv-verl/bin/python -m pytest tests/verl -q "$@"
