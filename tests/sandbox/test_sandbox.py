"""run_python in the real sandbox: values as data, what the sandbox sees, nondeterminism,
the filter, input errors, the unisolated mode, and a clear error where bwrap cannot run."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyseccomp
import pytest

from dyngen.errors import DyngenError
from dyngen.sandbox import (
    SandboxInputError,
    SandboxUnavailableError,
    probe,
    require_bwrap,
    run_deterministic,
    run_python,
    same_value,
    screen,
)
from dyngen.sandbox.bwrap import interpreter

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("argument", "value"), [
    ([3, 1, 2], "[1, 2, 3]"), ((2, 1), "[1, 2]"), ("cab", "['a', 'b', 'c']"),
    ({"b": 1, "a": 2}, "['a', 'b']"), (b"\x02\x01", "[1, 2]"), ({3, 1}, "[1, 3]"),
])
def test_the_argument_and_the_value_cross_as_literals(argument: object, value: str) -> None:
    result = run_python("def f(x):\n    return sorted(x)\n", "f", argument)
    assert (result.ok, result.value, result.reason) == (True, value, None)


@pytest.mark.parametrize("argument", [
    -3, -0.5, 1e100, 2 + 3j, -1 - 2j, set(), (1,), (), b"\x00'\"", "it's \"x\"\n", None, True,
    {"a": [1, (2, {3})], -1: {}}, [[[]]], 10**40,
])
def test_any_literal_crosses_unchanged(argument: object) -> None:
    """The runner reads literals with its own reader (no `ast` import): the same values."""
    result = run_python("def f(x):\n    return x\n", "f", argument)
    assert result.ok and result.value == repr(argument), result


def test_a_value_that_is_no_literal_comes_back_as_its_repr() -> None:
    program = "class P:\n    def __repr__(self):\n        return 'P()'\ndef f(x):\n    return P()"
    assert run_python(program, "f", None).value == "P()"


def test_what_the_sandbox_sees() -> None:
    program = ("import os, sys\ndef f(x):\n    return (sorted(os.listdir('/')), os.listdir("
               "'/tmp'), os.getcwd(), os.getuid(), sorted(os.environ), sys.path)\n")
    result = run_python(program, "f", 0, screened=False)
    assert result.ok, result
    top, tmp, cwd, uid, env, path = eval(result.value)  # our own literal
    # the interpreter's prefix (e.g. /root for pyenv, /usr for Debian's) and system libraries
    expected = {"dev", "tmp", "usr", "lib", "lib64", interpreter().parts[1]}
    assert set(top) <= expected and {"dev", "tmp"} <= set(top), top
    assert (tmp, cwd) == ([], "/tmp")
    assert uid != 0
    assert env == ["HOME", "LC_ALL", "PWD", "PYTHONHASHSEED", "PYTHONUTF8"]  # PWD: bwrap
    assert not any("site-packages" in p for p in path), path
    # the standard library works; the worker's packages are not there
    stdlib = ("import json, hashlib, decimal, collections, itertools, re, fractions\n"
              "def f(x):\n    return hashlib.sha256(json.dumps(x).encode()).hexdigest()[:8]\n")
    assert run_python(stdlib, "f", [1]).ok
    missing = run_python("def f(x):\n    import datasets\n", "f", 0)
    assert (missing.reason, "ModuleNotFoundError" in missing.detail) == ("error", True)


def test_a_value_that_changes_between_runs_is_nondeterministic() -> None:
    result = run_deterministic("import random\ndef f(x):\n    return random.random()\n", "f", 0)
    assert (result.ok, result.reason) == (False, "nondeterministic")
    assert "run 1 gave" in result.detail
    # String hashing differs between the runs (two hash seeds): a list built from a set is
    # caught, while a set or dict of the same items is one value in any order.
    words = ["apple", "pear", "fig", "kiwi", "plum", "lime", "date", "yuzu"]
    listed = run_deterministic("def f(x):\n    return list(set(x))\n", "f", words)
    assert listed.reason == "nondeterministic"
    counted = run_deterministic("def f(x):\n    return {w: len(w) for w in set(x)}\n", "f", words)
    assert counted.ok and eval(counted.value) == {w: len(w) for w in words}


@pytest.mark.parametrize(("a", "b", "same"), [
    ("[1, 2]", "[1,2]", True), ("{'a': 1, 'b': 2}", "{'b': 2, 'a': 1}", True),
    ("{3, 1}", "{1, 3}", True), ("2", "2.0", True), ("True", "1", False),
    ("[1, 2]", "(1, 2)", False), ("'1'", "1", False), ("P()", "P()", True), ("P()", "Q()", False),
])
def test_same_value_compares_literals_by_value(a: str, b: str, same: bool) -> None:
    assert same_value(a, b) is same


def test_limits_on_what_comes_back() -> None:
    big = run_python("def f(x):\n    return 'x' * x\n", "f", 50_000)
    assert (big.reason, "50002 characters" in big.detail) == ("output_limit", True)
    assert run_python("def g(x):\n    return x\n", "f", 0).reason == "error"
    assert run_python("def f(x):\n    return (\n", "f", 0).reason == "error"


@pytest.mark.parametrize(("program", "why"), [
    ("import os\ndef f(x): return 1", "imports os"),
    ("from subprocess import run\ndef f(x): return 1", "imports from subprocess"),
    ("def f(x): return __import__('os')", "uses __import__"),
    ("def f(x): return ().__class__", "uses the attribute .__class__"),
    ("def f(x): return eval('1')", "uses eval"),
    ("import random\ndef f(x): return random.os", "uses the attribute .os"),
])
def test_the_filter_names_what_it_forbids(program: str, why: str) -> None:
    assert screen(program) == why
    result = run_python(program, "f", 0)
    assert (result.reason, result.detail) == ("forbidden", why)


def test_the_filter_passes_ordinary_programs() -> None:
    program = ("import collections, itertools, functools, math, re, string, heapq\n"
               "def f(input):\n    return sorted(collections.Counter(re.findall(r'\\w', input)))\n")
    assert screen(program) is None
    assert run_python(program, "f", "b a b").value == "['a', 'b']"


def test_input_that_cannot_cross_is_refused_clearly() -> None:
    with pytest.raises(SandboxInputError, match="argument: expected data .* found object"):
        run_python("def f(x): return x", "f", object())
    with pytest.raises(SandboxInputError, match="function: expected a Python name"):
        run_python("def f(x): return x", "f(1)", 0)
    with pytest.raises(SandboxInputError, match="memory_mb: expected 64..65536"):
        run_python("def f(x): return x", "f", 0, memory_mb=8)
    assert issubclass(SandboxInputError, DyngenError)


def test_concurrent_runs_keep_their_own_results() -> None:
    with ThreadPoolExecutor(4) as pool:
        values = list(pool.map(lambda i: run_python("def f(x):\n    return x * x", "f", i)
                               .value, range(12)))
    assert values == [str(i * i) for i in range(12)]


def test_unisolated_runs_with_rlimits_and_the_timeout_only() -> None:
    assert run_python("def f(x):\n    return x + 1", "f", 1, isolation="unisolated").value == "2"
    loop = run_python("def f(x):\n    while True: pass", "f", 1, isolation="unisolated",
                      timeout_seconds=0.5)
    assert loop.reason == "timeout"
    memory = run_python("def f(x):\n    return bytearray(8 * 2**30)", "f", 1,
                        isolation="unisolated")
    assert memory.reason == "memory"


def test_where_bwrap_cannot_run_the_error_says_what_to_do(monkeypatch: pytest.MonkeyPatch,
                                                          tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on it
    probe.bwrap_problem.cache_clear()
    try:
        with pytest.raises(SandboxUnavailableError, match="bwrap is not on PATH") as error:
            run_python("def f(x): return x", "f", 0)
        assert "apt-get install bubblewrap" in str(error.value)
        assert "data.datagen.sandbox=unisolated" in str(error.value)
        assert run_python("def f(x): return x", "f", 0, isolation="unisolated").ok
    finally:
        probe.bwrap_problem.cache_clear()
    monkeypatch.undo()
    require_bwrap()  # installed here, as in CI


@pytest.mark.skipif(os.geteuid() != 0, reason="starts a worker as another user (CI also runs "
                    "this whole suite as one: scripts/test-sandbox-unprivileged.sh)")
def test_a_worker_that_is_not_root_gets_a_user_namespace() -> None:
    """Run by an unprivileged user, bwrap's own user namespace keeps the sandbox at that uid,
    and RLIMIT_NPROC (counted per namespace) still stops a fork."""
    python = "/usr/bin/python3"
    assert os.access(python, os.X_OK), "the non-root case runs the system's python3"
    # The worker (uid 65534) imports dyngen.sandbox from a copy it can read: a checkout
    # may sit in a folder only root can enter.
    folder = Path(tempfile.mkdtemp(prefix="dyngen-nonroot-"))
    try:
        folder.chmod(0o755)
        package = folder / "dyngen"
        shutil.copytree(REPO / "dyngen" / "sandbox", package / "sandbox",
                        ignore=shutil.ignore_patterns("__pycache__"))
        for name in ("__init__.py", "errors.py"):
            shutil.copy(REPO / "dyngen" / name, package / name)
        shutil.copy(pyseccomp.__file__, folder)  # the seccomp filter's builder
        for path in folder.rglob("*"):
            path.chmod(0o755 if path.is_dir() else 0o644)
        script = ("import sys; sys.path.insert(0, sys.argv[1])\n"
                  "from dyngen.sandbox import run_python\n"
                  "print(run_python('def f(x):\\n    return x + 1', 'f', 1).value)\n"
                  "r = run_python('import os\\ndef f(x):\\n    os.fork()', 'f', 0, "
                  "screened=False)\n"
                  "print(r.reason, r.detail)\n")
        out = subprocess.run([python, "-B", "-c", script, str(folder)], capture_output=True,
                             text=True, user=65534, group=65534, extra_groups=[], cwd=folder,
                             timeout=60, env={"PATH": os.environ["PATH"]})
    finally:
        shutil.rmtree(folder)
    assert out.stdout.splitlines() == ["2", "error BlockingIOError: [Errno 11] Resource "
                                       "temporarily unavailable"], out.stderr
