"""Hostile input returns a result, never raises: parser bombs, huge ints, inf and nan, values
that cannot be shown; and the filter's reach (from-imports, match patterns, private modules,
Formatter.get_field). (Code tasks and rewards: tests/generators/test_code_task_hostile.py.)"""

from __future__ import annotations

import pytest

from dyngen.sandbox import SandboxInputError, run_deterministic, run_python, screen

DEEP = "def f(x):\n    return " + "-" * 3000 + "x\n"  # the parser's recursion, not its parens
ECHO = "def f(x):\n    return x\n"


@pytest.mark.parametrize("screened", [True, False])
def test_a_program_nested_3000_deep_is_a_result(screened: bool) -> None:
    result = run_python(DEEP, "f", 1, screened=screened)
    assert not result.ok and result.reason == ("forbidden" if screened else "error"), result
    assert screen(DEEP) == "is nested too deeply to read"
    nested = "def f(x):\n    return " + "[" * 3000 + "]" * 3000 + "\n"
    assert run_python(nested, "f", 1).reason in ("forbidden", "error")


@pytest.mark.parametrize("argument", [
    float("inf"), float("-inf"), float("nan"), [1, float("nan")], 10**5000, {"a": 10**4400},
], ids=["inf", "-inf", "nan", "list-nan", "int-5001-digits", "dict-int-4401-digits"])
def test_an_argument_that_cannot_cross_is_an_error_result(argument: object) -> None:
    for result in (run_python(ECHO, "f", argument), run_deterministic(ECHO, "f", argument)):
        assert (result.ok, result.reason) == (False, "error"), result


def test_deep_and_long_arguments_are_error_results() -> None:
    deep: list = []
    for _ in range(3000):
        deep = [deep]
    assert run_python(ECHO, "f", deep).reason == "error"
    assert run_python(ECHO, "f", "x" * 200_000).reason == "error"
    assert run_python(ECHO, "f", 10**4000).ok  # 4,001 digits: under the int-to-str limit
    with pytest.raises(SandboxInputError, match="found object"):  # not data: a caller's bug
        run_python(ECHO, "f", object())


@pytest.mark.parametrize(("program", "detail"), [
    ("def f(x):\n    return 10 ** 5000\n", "ValueError"),  # the int-to-str limit
    ("class P:\n    def __repr__(self):\n        raise RuntimeError('no')\n"
     "def f(x):\n    return P()\n", "RuntimeError"),
    ("class P:\n    def __repr__(self):\n        return 3\ndef f(x):\n    return P()\n",
     "TypeError"),
    ("def f(x):\n    v = []\n    for _ in range(100000):\n        v = [v]\n    return v\n",
     "RecursionError"),
])
def test_a_value_that_cannot_be_shown_is_an_error(program: str, detail: str) -> None:
    result = run_python(program, "f", 0)
    assert (result.ok, result.reason) == (False, "error") and detail in result.detail, result


@pytest.mark.parametrize(("program", "why"), [
    ("from posixpath import os\ndef f(x): return os.getpid()", "imports os from posixpath"),
    ("from random import _os\ndef f(x): return 1", "imports _os from random"),
    ("import _io\ndef f(x): return 1", "imports _io"),
    ("from _posixsubprocess import fork_exec\ndef f(x): return 1",
     "imports from _posixsubprocess"),
    ("import random\ndef f(x): return random._os", "uses the attribute ._os"),
    ("import string\ndef f(x):\n    return string.Formatter().get_field('0.__class__', [x], {})",
     "uses the attribute .get_field"),
    ("def f(x):\n    match x:\n        case object(__class__=c):\n            return c",
     "uses the attribute .__class__"),
])
def test_the_filter_checks_what_a_program_imports_and_matches(program: str, why: str) -> None:
    assert screen(program) == why
    assert screen("from __future__ import annotations\nclass A:\n    def __init__(self):\n"
                  "        self._cache = {}\ndef f(x):\n    match x:\n"
                  "        case [a, b]:\n            return a\n") is None
