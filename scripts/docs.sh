#!/usr/bin/env bash
# Serve the documentation site on 127.0.0.1 (default port 8000), rebuilt on every edit.
#   bash scripts/docs.sh              http://127.0.0.1:8000
#   bash scripts/docs.sh 8123         another port
# Installs dyngen and the docs extra into $VENV (default .venv) first if mkdocs is not there
# (scripts/setup.sh --docs: at the lock's versions).
if [ "${1:-}" = --help ] || [ "${1:-}" = -h ]; then  # usage, and nothing done
    echo "usage: bash scripts/docs.sh [PORT]"
    sed -n '2,/^[^#]/s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"
    exit 0
fi
set -euo pipefail
cd "$(dirname "$0")/.."
export VENV="${VENV:-.venv}"
if [ ! -x "$VENV/bin/mkdocs" ]; then
    bash scripts/setup.sh --docs
fi
# Material and a plugin print a banner about MkDocs 2.0 on every build; the docs extra
# keeps MkDocs below 2.
export NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true
exec "$VENV/bin/mkdocs" serve --dev-addr "127.0.0.1:${1:-8000}"
