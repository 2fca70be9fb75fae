#!/usr/bin/env bash
# The Debian packages the tests need beside the venvs: Chromium (tests/e2e/test_ui.py),
# bubblewrap and libseccomp2 (the sandbox: tests/sandbox, code tasks, the verl suite's code
# reward), and, as root, the system python3 with pytest for the unprivileged sandbox suite.
# Installed once by whichever of scripts/test.sh and scripts/test-verl.sh gets here first
# (CI runs both at once; apt takes one installer at a time), the other waits, then finds
# nothing missing.
#   --sandbox  only what the sandbox needs (bubblewrap, libseccomp2)
if [ "${1:-}" = --help ] || [ "${1:-}" = -h ]; then  # usage, and nothing done
    echo "usage: bash scripts/system-packages.sh [--sandbox]"
    sed -n '2,/^[^#]/s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"
    exit 0
fi
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .dyngen
exec 9> .dyngen/system-packages.lock
flock 9
all=1
[ "${1:-}" = "--sandbox" ] && all=0
missing=()
if [ "$all" = 1 ] && ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then
    missing+=(chromium)
fi
if ! command -v bwrap >/dev/null; then
    missing+=(bubblewrap)
fi
if ! compgen -G "/usr/lib/*/libseccomp.so.2" >/dev/null \
        && ! compgen -G "/lib/*/libseccomp.so.2" >/dev/null; then
    missing+=(libseccomp2)  # the sandbox's seccomp filter (PyPI pyseccomp binds it)
fi
if [ "$all" = 1 ] && [ "$(id -u)" = 0 ] && ! /usr/bin/python3 -c "import pytest, pytest_timeout, seccomp" \
        2>/dev/null; then
    # tests/sandbox as an unprivileged user (scripts/test-sandbox-unprivileged.sh), with the
    # system's python3 (and libseccomp's own bindings, for a worker started by that python3
    # without pyseccomp), each test under a time limit as in the main suite
    missing+=(python3 python3-pytest python3-pytest-timeout python3-seccomp)
fi
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then
        apt-get -o DPkg::Lock::Timeout=600 update -qq
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
            "${missing[@]}" >/dev/null
    else
        echo "The tests need: sudo apt-get install ${missing[*]}" >&2
        exit 1
    fi
fi
