"""Renumbering a seed: its own text with larger numbers, and the answer its formula gives.

A renumbered task is sound only if the story still makes sense with the new numbers and
the formula is really the seed's. `renumber` refuses, or redraws, when it would not:
  fixed       a clock time (3 pm, 9:30), a year (in 2019), or a number that is a unit
              conversion (7 days in a week) stays as it is;
  bounded     a percentage stays <= 100, a count per period within the period (5 days a
              week <= 7, 8 hours a day <= 24, ...);
  steps       every intermediate result of the formula stays positive, and whole where the
              seed's was whole (half of an odd count, 12.5 cookies per bag are refused);
  ambiguous   if another formula over the seed's numbers (each used once) also gives the
              seed's answer but differs on other numbers (4 - 2 and 4 / 2), the formula the
              model wrote may not be the seed's: the proposal is dropped ("ambiguous_formula");
              a formula of more than MAX_FORMULA_NUMBERS numbers is not renumbered
              ("formula_unchecked").
"""

from __future__ import annotations

import ast
import random
import re
from fractions import Fraction
from functools import lru_cache
from typing import Any

from dyngen.generators.proposer.arithmetic import (
    NUMBER,
    OPS,
    RAW_NUMBER,
    answer_of,
    format_number,
    numbers_in,
    safe_eval,
)

# Counts of a unit per period: the bound, which is also the conversion constant itself.
PERIOD_BOUNDS = {("day", "week"): 7, ("hour", "day"): 24, ("minute", "hour"): 60,
                 ("second", "minute"): 60, ("month", "year"): 12, ("week", "year"): 52,
                 ("day", "month"): 31, ("day", "year"): 366, ("inch", "foot"): 12,
                 ("cent", "dollar"): 100}
_PER_PERIOD = re.compile(r"\s*(?P<unit>day|hour|minute|second|month|week|inch|cent)(?:e?s)?\s+"
                         r"(?:a|an|per|each|every|in\s+(?:a|an|one|each|every))\s+"
                         r"(?P<period>week|day|hour|minute|year|month|foot|dollar)\b", re.I)
_PERCENT = re.compile(r"\s*(?:%|percent\b)", re.I)
_CLOCK_AFTER = re.compile(r"(?::\d\d|\s*(?:am|pm|a\.m\.|p\.m\.|o'clock)\b)", re.I)
_YEAR_BEFORE = re.compile(r"\b(?:in|since|of|year|until|by)\s+$", re.I)
MAX_FORMULA_NUMBERS = 4  # above this, enumerating the other formulas takes seconds


def renumber(question: str, expr: str, rng: random.Random
             ) -> tuple[tuple[str, str] | None, str]:
    """((`question` with larger numbers, its answer by `expr`), "") or (None, why not)."""
    values = sorted(numbers_in(question))
    if any((v * 100).denominator != 1 for v in values):
        return None, "renumber_failed"
    if len(NUMBER.findall(expr)) > MAX_FORMULA_NUMBERS:
        return None, "formula_unchecked"  # too many numbers to rule out a coincidence
    if ambiguous(expr):
        return None, "ambiguous_formula"
    caps = _caps(question)
    for _ in range(200):  # redraw until every step keeps its kind and the answer is usable
        new = {v: _larger(v, caps.get(v), rng) for v in values}
        if new == {v: v for v in values}:
            return None, "renumber_failed"  # every number is fixed: nothing to renumber
        truth, _ = answer_of(safe_eval(_substitute(NUMBER, expr, new, lambda v: f"({v})")))
        if truth and len(set(new.values())) == len(new) and _steps_keep_kind(expr, new):
            return (_substitute(RAW_NUMBER, question, new, format_number), truth), ""
    return None, "renumber_failed"


def _caps(question: str) -> dict[Fraction, Fraction]:
    """The largest value each of the question's numbers may take (its own value: fixed)."""
    caps: dict[Fraction, Fraction] = {}
    for m in RAW_NUMBER.finditer(question):
        v = Fraction(m[0].replace(",", ""))
        before, after = question[:m.start()], question[m.end():]
        cap = None
        clock = _CLOCK_AFTER.match(after) or before.endswith(":")
        year = v.denominator == 1 and 1900 <= v <= 2100 and _YEAR_BEFORE.search(before)
        if clock or year:
            cap = v
        elif _PERCENT.match(after):
            cap = Fraction(100)
        elif per := _PER_PERIOD.match(after):
            bound = PERIOD_BOUNDS.get((per["unit"].lower(), per["period"].lower()))
            cap = Fraction(bound) if bound is not None else None
        if cap is not None:
            caps[v] = min(caps.get(v, cap), max(cap, v))
    return caps


def _larger(v: Fraction, cap: Fraction | None, rng: random.Random) -> Fraction:
    """A number above `v`, up to about four times it (and `cap`), in whole units or cents."""
    unit = Fraction(1) if v.denominator == 1 else Fraction(1, 100)
    steps = int(v / unit)
    top = max(steps + 9, 4 * steps)
    if cap is not None:
        top = min(top, int(cap / unit))
    return v if top <= steps else unit * rng.randint(steps + 1, top)


def _substitute(pattern: re.Pattern[str], text: str, new: dict[Fraction, Fraction],
                fmt: Any) -> str:
    def swap(m: re.Match[str]) -> str:
        v = Fraction(m[0].replace(",", ""))
        return str(fmt(new[v])) if v in new else m[0]

    return pattern.sub(swap, text)


def formula_steps(expr: str, values: dict[Fraction, Fraction] | None = None) -> list[Fraction]:
    """The value of every operation in `expr`, innermost first, numbers mapped by `values`."""
    out: list[Fraction] = []

    def value(node: ast.AST) -> Fraction:
        if isinstance(node, ast.BinOp):
            v = OPS[type(node.op)](value(node.left), value(node.right))
            out.append(v)
            return v
        if isinstance(node, ast.UnaryOp):
            return -value(node.operand)
        v = Fraction(str(node.value))  # type: ignore[attr-defined]  # checked by safe_eval
        return (values or {}).get(v, v)

    value(ast.parse(expr, mode="eval").body)
    return out


def _steps_keep_kind(expr: str, new: dict[Fraction, Fraction]) -> bool:
    """Every step of `expr` stays positive, and whole where it was whole with the old numbers."""
    try:
        pairs = zip(formula_steps(expr), formula_steps(expr, new), strict=True)
        return all(n > 0 and (o.denominator != 1 or n.denominator == 1) for o, n in pairs)
    except ZeroDivisionError:
        return False


def ambiguous(expr: str) -> bool:
    """Whether another formula over `expr`'s numbers, each used once, gives the same value
    but a different one when the numbers change (so the model's formula may not be meant)."""
    numbers = [Fraction(n) for n in NUMBER.findall(expr)]
    target = safe_eval(expr)
    if target is None:
        return False
    # Two fixed probes stand in for "any other numbers": formulas equal on both are the same.
    probe = random.Random(0)
    distinct = sorted(set(numbers))
    probes = [{v: Fraction(probe.randint(2, 997), probe.randint(1, 13)) for v in distinct}
              for _ in range(2)]
    mine = tuple(safe_eval(_substitute(NUMBER, expr, p, lambda v: f"({v})")) for p in probes)
    leaves = [(v, *(p[v] for p in probes)) for v in numbers]
    return any(old == target and tuple(others) != mine
               for old, *others in _formulas(tuple(leaves)))


@lru_cache(maxsize=256)  # the same sub-multisets recur across splits
def _formulas(leaves: tuple[tuple[Fraction, ...], ...]) -> frozenset[tuple[Fraction, ...]]:
    """The values (at the seed's numbers and at each probe) of every formula over `leaves`."""
    if len(leaves) == 1:
        return frozenset(leaves)
    out: set[tuple[Fraction, ...]] = set()
    n = len(leaves)
    for mask in range(1, 2 ** n - 1):
        if mask & 1 == 0:
            continue  # each split once: the first leaf always goes left
        left = tuple(x for i, x in enumerate(leaves) if mask >> i & 1)
        right = tuple(x for i, x in enumerate(leaves) if not mask >> i & 1)
        for a in _formulas(left):
            for b in _formulas(right):
                out.update(_combine(a, b))
    return frozenset(out)


def _combine(a: tuple[Fraction, ...], b: tuple[Fraction, ...]) -> list[tuple[Fraction, ...]]:
    """a + b, a - b, b - a, a * b, a / b, b / a, component-wise (none that divides by zero)."""
    out = [tuple(x + y for x, y in zip(a, b, strict=True)),
           tuple(x - y for x, y in zip(a, b, strict=True)),
           tuple(y - x for x, y in zip(a, b, strict=True)),
           tuple(x * y for x, y in zip(a, b, strict=True))]
    if all(b):
        out.append(tuple(x / y for x, y in zip(a, b, strict=True)))
    if all(a):
        out.append(tuple(y / x for x, y in zip(a, b, strict=True)))
    return out
