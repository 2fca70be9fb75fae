# Sourced by setup.sh, setup-verl.sh and lock.sh, with VENV set (and LOCK: which of
# constraints/*.txt pins this environment, or none): `pip_install` and `editable_install`
# into $VENV with uv (parallel downloads and unpacking: a few times faster than pip), given
# pip's own settings on this machine (find-links, constraints, indexes) and the lock. Where
# uv cannot be installed, pip does the same.
if [ "${BASH_SOURCE[0]}" = "$0" ] && { [ "${1:-}" = --help ] || [ "${1:-}" = -h ]; }; then
    echo "usage: source scripts/install.sh  (from a script, with VENV and LOCK set)"
    sed -n '1,/^[^#]/s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"
    exit 0
fi
: "${VENV:?VENV must be set}"
: "${LOCK:?LOCK must be set: a name in constraints/, or none}"
# Where packages come from, as pip's settings say (also what scripts/lock.sh resolves with).
uv_index_args=()
pip_setting() {  # an environment variable, else pip's configuration
    local name=$1 key=$2
    if [ -n "${!name:-}" ]; then echo "${!name}"; return; fi
    "$VENV/bin/python" -m pip config get "global.$key" 2>/dev/null || true
}
for link in $(pip_setting PIP_FIND_LINKS find-links); do uv_index_args+=(--find-links "$link"); done
for file in $(pip_setting PIP_CONSTRAINT constraint); do
    [ -f "$file" ] && uv_index_args+=(--constraint "$file")
done
index=$(pip_setting PIP_INDEX_URL index-url)
[ -n "$index" ] && uv_index_args+=(--index-url "$index")
extra=0
for url in $(pip_setting PIP_EXTRA_INDEX_URL extra-index-url); do
    # pip skips an index folder that is not there; uv would fail on it.
    if [[ "$url" == file://* ]] && [ ! -d "${url#file://}" ]; then continue; fi
    uv_index_args+=(--extra-index-url "$url")
    extra=1
done
# Like pip, the best version across every index (uv's default takes the first index's).
[ "$extra" = 1 ] && uv_index_args+=(--index-strategy unsafe-best-match)

# The lock: constraints/$LOCK.txt pins every package this environment may hold (made by
# scripts/lock.sh for one Python version, its `# python:` line). On another Python, or with
# DYNGEN_NO_LOCK=1 (to try the newest releases), the install is unpinned, with a warning.
lock_args=()
if [ "$LOCK" != none ]; then
    lock_file="constraints/$LOCK.txt"
    lock_python=$(sed -n 's/^# python: \([0-9.]*\).*/\1/p' "$lock_file" 2>/dev/null || true)
    venv_python=$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    if [ "${DYNGEN_NO_LOCK:-}" = 1 ]; then
        echo "DYNGEN_NO_LOCK=1: installing into $VENV without $lock_file (newest releases)" >&2
    elif [ ! -f "$lock_file" ]; then
        echo "warning: $lock_file is missing; installing into $VENV unpinned" >&2
    elif [ "$venv_python" != "$lock_python" ]; then
        echo "warning: $lock_file is for Python $lock_python and $VENV has Python" \
             "$venv_python; installing unpinned (versions may differ from CI's)" >&2
    else
        lock_args=(--constraint "$lock_file")
    fi
fi

# --compile-bytecode: as pip does; where PYTHONDONTWRITEBYTECODE is set (CI here), nothing
# would ever write a .pyc and every process would compile what it imports (imports 3x slower).
uv_args=(--python "$VENV/bin/python" --quiet --compile-bytecode "${uv_index_args[@]}"
         "${lock_args[@]}")
# uv itself at the lock's version where the lock has one.
if "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${lock_args[@]}" uv \
        2>/dev/null; then
    pip_install() { "$VENV/bin/uv" pip install "${uv_args[@]}" "$@"; }
else
    echo "uv could not be installed; installing with pip" >&2
    pip_install() { "$VENV/bin/python" -m pip install --quiet "${lock_args[@]}" "$@"; }
fi
# An editable install writes dyngen.egg-info/ into this checkout: one at a time (CI sets up
# several environments at once).
editable_install() {
    mkdir -p .dyngen
    (
        flock 9
        pip_install -e "$@"
    ) 9> .dyngen/editable-install.lock
}
