#!/usr/bin/env bash
# The sandbox's tests again as an unprivileged user, the usual deployment: there bwrap makes
# a user namespace, and what root never sees (its own tmpfs mounts writable, no cgroup) must
# hold too. Run as root (scripts/test.sh does); creates the user dyngen-sandbox if missing.
# The user cannot read a checkout under /root nor the venv's interpreter there, so it runs a
# world-readable copy of dyngen and tests/sandbox with the system's python3 and pytest
# (Debian: python3-pytest), and the venv's pyseccomp (one pure-Python file).
if [ "${1:-}" = --help ] || [ "${1:-}" = -h ]; then  # usage, and nothing done
    echo "usage: bash scripts/test-sandbox-unprivileged.sh [PYTEST OPTIONS]  (as root)"
    sed -n '2,/^[^#]/s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"
    exit 0
fi
set -euo pipefail
cd "$(dirname "$0")/.."
user=dyngen-sandbox
if ! id -u "$user" >/dev/null 2>&1; then
    useradd --system --no-create-home --shell /usr/sbin/nologin "$user"
fi
copy=$(mktemp -d)
trap 'rm -rf "$copy"' EXIT
mkdir -p "$copy/tests" "$copy/home"
cp -r dyngen "$copy/"
cp -r tests/sandbox "$copy/tests/"
touch "$copy/tests/__init__.py"
find "$copy" -name __pycache__ -prune -exec rm -rf {} +
"${VENV:-.venv}/bin/python" -c 'import pyseccomp, shutil, sys; shutil.copy(pyseccomp.__file__, sys.argv[1])' "$copy"
chmod -R a+rX "$copy"
chown "$user" "$copy/home"
cd "$copy"
exec runuser -u "$user" -- env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$copy/home" \
    PYTHONPATH="$copy" PYTHONDONTWRITEBYTECODE=1 \
    /usr/bin/python3 -m pytest -q -p no:cacheprovider --timeout 300 --rootdir "$copy" \
    tests/sandbox "$@"
