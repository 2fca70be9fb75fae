#!/usr/bin/env bash
# The README's first command in an environment of its own (.venv-demo, the base package and
# the server extra): the demo must finish with its Prefect server on PostgreSQL, and that
# environment must hold no torch (the demo never needs it; on a user's machine an unpinned
# torch is a multi-GB CUDA download).
if [ "${1:-}" = --help ] || [ "${1:-}" = -h ]; then  # usage, and nothing done
    echo "usage: bash scripts/check-demo.sh"
    sed -n '2,/^[^#]/s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"
    exit 0
fi
set -euo pipefail
cd "$(dirname "$0")/.."
export VENV=.venv-demo
out=.dyngen/check-demo.out
bash scripts/demo.sh --workdir .dyngen/check-demo 2>&1 | tee "$out"
grep -q "PostgreSQL in" "$out" || { echo "check-demo: the demo's server was not on PostgreSQL" >&2; exit 1; }
if "$VENV/bin/python" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("torch") is None)'; then
    echo "check-demo: torch is installed in $VENV; the demo's set-up must not install it" >&2
    exit 1
fi
test -s .dyngen/check-demo/report.html || { echo "check-demo: the demo wrote no report" >&2; exit 1; }
echo "check-demo: the demo finished in $VENV on PostgreSQL, without torch"
