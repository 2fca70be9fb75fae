"""Data across the sandbox's boundary: an argument as a literal, two values compared."""

from __future__ import annotations

import ast
from typing import Any

from dyngen.errors import SandboxInputError

MAX_ARGUMENT_CHARS = 100_000
_DATA = (int, float, complex, str, bytes, bool, type(None), list, tuple, dict, set, frozenset)


class UnshowableArgumentError(SandboxInputError):
    """Data of literal types that still cannot cross: inf, nan, an int too long to print, a
    nesting too deep or a text too long to read back. run_python reports it as an error."""


def only_data(argument: Any) -> bool:
    """Whether `argument` is made of literal types only (its nesting walked without
    recursion, so a deep one is no RecursionError)."""
    stack, seen = [argument], 0
    while stack:
        value = stack.pop()
        seen += 1
        if type(value) not in _DATA or seen > MAX_ARGUMENT_CHARS:
            return False
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, (list, tuple, set, frozenset)):
            stack.extend(value)
    return True


def argument_literal(argument: Any) -> str:
    """`argument` as a Python literal that reads back equal, or a SandboxInputError
    (UnshowableArgumentError for data of literal types that cannot cross)."""
    try:
        text = repr(argument)
        same = len(text) <= MAX_ARGUMENT_CHARS and ast.literal_eval(text) == argument
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        text, same = "?", False
    if not same and only_data(argument):
        raise UnshowableArgumentError(
            f"argument: expected data that reads back as a Python literal; found "
            f"{type(argument).__name__} {text[:80]!r} (inf, nan, an int too long to print, a "
            f"nesting too deep, or over {MAX_ARGUMENT_CHARS} characters).")
    if not same:
        raise SandboxInputError(
            f"argument: expected data that crosses the sandbox as a Python literal (numbers, "
            f"strings, bytes, booleans, None, and lists, tuples, dicts and sets of them); "
            f"found {type(argument).__name__} {text[:80]!r}. Pass plain data, not objects.")
    return text


def same_value(a: str, b: str) -> bool:
    """Whether two reprs are the same value: read as literals where both are (so dicts and
    sets in any order, `[1, 2]` and `[1,2]`), else as text. True is not 1, a list is not a
    tuple; an int equals the float of the same number."""
    try:
        return _equal(ast.literal_eval(a.strip()), ast.literal_eval(b.strip()))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return a.strip() == b.strip()


def _equal(a: Any, b: Any) -> bool:
    """Values equal as labels: bools apart from numbers, lists apart from tuples."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float, complex)) and isinstance(b, (int, float, complex)):
        return a == b
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(v, b[k]) for k, v in a.items())
    return bool(a == b)
