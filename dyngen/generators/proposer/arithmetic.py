"""Exact arithmetic on word problems: numbers in a text, safe evaluation, usable answers.

Nothing here trusts a model's arithmetic: expressions are parsed with `ast` and only numbers,
+ - * / and parentheses are evaluated, exactly (fractions). An answer is usable when it is
positive and whole or in cents.
"""

from __future__ import annotations

import ast
import operator
import re
from collections import Counter
from fractions import Fraction

NUMBER = re.compile(r"\d+(?:\.\d+)?")
RAW_NUMBER = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?")
_EXPR_CHARS = re.compile(r"[\d\s.+\-*/()]+")
OPERATOR = re.compile(r"\d\s*\)?\s*[-+*/]\s*\(?\s*\d")
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv}


def clean_math(text: str) -> str:
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)  # 1,000 → 1000
    text = re.sub(r"(?<=\d)\s*[x×]\s*(?=\d)", " * ", text).replace("÷", "/")
    return re.sub(r"[A-Za-z$€£%:]+", " ", text).strip()


def safe_eval(expr: str) -> Fraction | None:
    """The exact value of numbers joined by + - * / and parentheses, else None."""
    if len(expr) > 120 or not _EXPR_CHARS.fullmatch(expr):
        return None
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError:
        return None

    def value(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return Fraction(str(node.value))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = value(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            return OPS[type(node.op)](value(node.left), value(node.right))
        raise ValueError(f"not arithmetic: {ast.dump(node)[:40]}")

    try:
        return value(tree.body)
    except (ValueError, ZeroDivisionError):
        return None


def format_number(v: Fraction) -> str | None:
    """A whole number, or a decimal with at most two places; None for anything else."""
    if v.denominator == 1:
        return str(v.numerator)
    if (v * 100).denominator == 1:
        return f"{float(v):.2f}".rstrip("0")
    return None


def numbers_in(text: str) -> Counter[Fraction]:
    """The numbers a text mentions, with their counts (1,000 and 1000 alike)."""
    return Counter(Fraction(n) for n in NUMBER.findall(clean_math(text)))


def as_number(text: str | None) -> Fraction | None:
    """A ground truth as a number ("1,000", "12.50"), or None if it is not one."""
    try:
        return Fraction(str(text).replace(",", "").strip()) if text is not None else None
    except (ValueError, ZeroDivisionError):
        return None


def first_number(text: str) -> Fraction | None:
    m = NUMBER.search(clean_math(text.split("\n")[0]))
    return Fraction(m[0]) if m else None


def answer_of(v: Fraction | None) -> tuple[str | None, str]:
    """(ground truth, "") of a calculation's value, or (None, why it is not usable)."""
    if v is None or v <= 0:
        return None, "nonpositive_answer"  # a story's count or amount is never <= 0
    return (format_number(v), "") if format_number(v) else (None, "inexact_answer")
