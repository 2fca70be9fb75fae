# Sourced by setup.sh and setup-verl.sh, with VENV set: `pip_install` and `editable_install`
# into $VENV with uv (parallel downloads and unpacking: a few times faster than pip), given
# pip's own settings on this machine (find-links, constraints, indexes). Where uv cannot be
# installed, pip does the same.
: "${VENV:?VENV must be set}"
# --compile-bytecode: as pip does; where PYTHONDONTWRITEBYTECODE is set (CI here), nothing
# would ever write a .pyc and every process would compile what it imports (imports 3x slower).
uv_args=(--python "$VENV/bin/python" --quiet --compile-bytecode)
pip_setting() {  # an environment variable, else pip's configuration
    local name=$1 key=$2
    if [ -n "${!name:-}" ]; then echo "${!name}"; return; fi
    "$VENV/bin/python" -m pip config get "global.$key" 2>/dev/null || true
}
for link in $(pip_setting PIP_FIND_LINKS find-links); do uv_args+=(--find-links "$link"); done
for file in $(pip_setting PIP_CONSTRAINT constraint); do
    [ -f "$file" ] && uv_args+=(--constraint "$file")
done
index=$(pip_setting PIP_INDEX_URL index-url)
[ -n "$index" ] && uv_args+=(--index-url "$index")
extra=0
for url in $(pip_setting PIP_EXTRA_INDEX_URL extra-index-url); do
    # pip skips an index folder that is not there; uv would fail on it.
    if [[ "$url" == file://* ]] && [ ! -d "${url#file://}" ]; then continue; fi
    uv_args+=(--extra-index-url "$url")
    extra=1
done
# Like pip, the best version across every index (uv's default takes the first index's).
[ "$extra" = 1 ] && uv_args+=(--index-strategy unsafe-best-match)

if "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check uv 2>/dev/null; then
    pip_install() { "$VENV/bin/uv" pip install "${uv_args[@]}" "$@"; }
else
    echo "uv could not be installed; installing with pip" >&2
    pip_install() { "$VENV/bin/python" -m pip install --quiet "$@"; }
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
