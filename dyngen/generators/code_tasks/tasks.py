"""The text of a code task, shared by the generator, the seed file and the reward.

deduction  the program and an input are given; the answer is the value the function returns
           (AZR's deduction), checked against the label by value;
abduction  the program and an output are given; the answer is an input the function maps to
           that output, checked by running the program on it in the sandbox.
Every prompt ends by asking for one line `Answer: <a Python literal>`.
"""

from __future__ import annotations

import ast
import re

DEDUCTION, ABDUCTION = "deduction", "abduction"
TASKS = (DEDUCTION, ABDUCTION)
_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(?P<code>.*?)```", re.S | re.I)
_CALL = re.compile(r"What does `(?P<call>[A-Za-z_]\w*\((?P<arg>.*)\))` return\?", re.S)


def deduction_prompt(program: str, function: str, argument: str) -> str:
    """Ask for the value `function(argument)` returns (argument: a literal's text)."""
    return (f"Here is a Python function:\n\n```python\n{program.strip()}\n```\n\n"
            f"What does `{function}({argument})` return? Think it through, then end your "
            f"reply with one line `Answer: <the value as a Python literal>`.")


def abduction_prompt(program: str, function: str, output: str) -> str:
    """Ask for an input that `function` maps to `output` (a literal's text)."""
    return (f"Here is a Python function:\n\n```python\n{program.strip()}\n```\n\n"
            f"Give an input `x` for which `{function}(x)` returns `{output}`. Think it "
            f"through, then end your reply with one line `Answer: <x as a Python literal>`.")


def code_block(text: str) -> str | None:
    """The first fenced code block of `text`, or None."""
    m = _BLOCK.search(text)
    return m["code"].strip("\n") if m else None


def program_of(text: str) -> tuple[str, str | None] | None:
    """(program, its input's text or None) a deduction prompt (or any text with a fenced
    block) shows, or None if it shows no program."""
    program = code_block(text)
    if program is None:
        return None
    call = _CALL.search(text)
    return program, (call["arg"] if call else None)


def literal(text: str) -> tuple[bool, object]:
    """(True, the value) if `text` is one Python literal, else (False, None)."""
    try:
        return True, ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False, None


def functions_of(program: str) -> list[str]:
    """The names of the top-level functions `program` defines (none if it does not parse)."""
    try:
        tree = ast.parse(program)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    return [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]


def normal_form(program: str) -> str:
    """A program's syntax without comments, spacing or docstrings: equal for copies."""
    try:
        tree = ast.parse(program)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return " ".join(program.split())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.Module)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    try:
        return ast.dump(tree)
    except (RecursionError, MemoryError):  # parsed, but too deep to print
        return " ".join(program.split())
