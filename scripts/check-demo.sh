#!/usr/bin/env bash
# The README's first command in an environment of its own (.venv-demo, base package only):
# the demo must finish, and that environment must hold no torch (the demo never needs it;
# on a user's machine an unpinned torch is a multi-GB CUDA download).
set -euo pipefail
cd "$(dirname "$0")/.."
export VENV=.venv-demo
bash scripts/demo.sh --workdir .dyngen/check-demo
if "$VENV/bin/python" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("torch") is None)'; then
    echo "check-demo: torch is installed in $VENV; the demo's set-up must not install it" >&2
    exit 1
fi
test -s .dyngen/check-demo/report.html || { echo "check-demo: the demo wrote no report" >&2; exit 1; }
echo "check-demo: the demo finished in $VENV without torch"
