#!/usr/bin/env bash
# Set up .venv (and Chromium for the UI test) and run the whole test suite (CI runs this).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    else
        echo "Chromium is needed for tests/e2e/test_ui.py: sudo apt-get install chromium" >&2
        exit 1
    fi
fi
.venv/bin/ruff check .
exec .venv/bin/python -m pytest "$@"
