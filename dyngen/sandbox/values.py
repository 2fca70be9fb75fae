"""Data across the sandbox's boundary: an argument as a literal, two values compared."""

from __future__ import annotations

import ast
from typing import Any

from dyngen.errors import SandboxInputError

MAX_ARGUMENT_CHARS = 100_000


def argument_literal(argument: Any) -> str:
    """`argument` as a Python literal that reads back equal, or a SandboxInputError."""
    text = repr(argument)
    try:
        same = ast.literal_eval(text) == argument
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        same = False
    if not same:
        raise SandboxInputError(
            f"argument: expected data that crosses the sandbox as a Python literal (numbers, "
            f"strings, bytes, booleans, None, and lists, tuples, dicts and sets of them); "
            f"found {type(argument).__name__} {text[:80]!r}. Pass plain data, not objects.")
    if len(text) > MAX_ARGUMENT_CHARS:
        raise SandboxInputError(f"argument: expected at most {MAX_ARGUMENT_CHARS} characters "
                                f"as a literal; found {len(text)}. Pass a smaller input.")
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
