"""Parsing and exact verification: which completions become rows, with what ground truth.

A completion becomes a row only if its question parses, has min..max_question_chars, holds
no "=", and is (normalised) neither a seed nor an earlier proposal — and its ground truth
can be *computed*, never copied from the model: arithmetic is parsed with `ast`; only
numbers, + - * / and parentheses are evaluated, exactly (fractions; answers must be
positive, whole or in cents). The answer's first calculation decides the `method`:
  computed    it uses exactly the question's numbers, each as often, and the model's own
              result for it is right (else "wrong_result": the model mostly chose the wrong
              operation too); or the question is "What is <arithmetic>?";
  renumbered  it uses exactly the seed's numbers and gives the seed's known answer: the
              formula is the seed's, so the seed's own text with every number replaced by a
              larger one, and the answer recomputed, is a sound harder task (the model's
              rewordings of a seed are often garbled, so its text is not used).
  model       (not kept by default) anything else, with the model's own result.
Whether a computed task's calculation fits its story is not checked, and a 135M model often
picks the wrong one: `methods: [renumbered]` keeps only sound tasks.
"""

from __future__ import annotations

import ast
import operator
import random
import re
from collections import Counter
from fractions import Fraction
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from generators.proposer.seeds import Seed

_QUESTION = re.compile(r"Question:[ \t]*(?P<q>[^\n]*)(?P<rest>.*)", re.S | re.I)
_ANSWER = re.compile(r"Answer:[ \t]*(?P<a>[^\n]*)", re.I)
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_RAW_NUMBER = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?")
_EXPR_CHARS = re.compile(r"[\d\s.+\-*/()]+")
_OPERATOR = re.compile(r"\d\s*\)?\s*[-+*/]\s*\(?\s*\d")
_WHAT_IS = re.compile(r"\s*(?:what is|what's|compute|calculate|evaluate)\s+(?:the value of\s+)?"
                      r"(?P<e>[-\d\s.,+*/×÷x()]+?)\s*(?:\?|\.|$)", re.I)
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv}


def normalise(text: str) -> str:
    """A question for comparison: case-folded, punctuation and spacing collapsed."""
    return " ".join(re.sub(r"[^\w]+", " ", text.casefold()).split())


def _clean_math(text: str) -> str:
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
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
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
    return Counter(Fraction(n) for n in _NUMBER.findall(_clean_math(text)))


def calculation(question: str, answer: str) -> tuple[str | None, Fraction | None, str]:
    """(the answer's first calculation, the model's result for it, "") or (None, None, why).

    Later calculations restate or wander. A question "What is <arithmetic>?" answered
    without a calculation is its own calculation.
    """
    parts = answer.split("=")
    for i, segment in enumerate(parts[:-1] or parts):
        expr = _clean_math(segment)
        if _OPERATOR.search(expr):
            if safe_eval(expr) is None:
                return None, None, "bad_calculation"
            return expr, _first_number(parts[i + 1] if i + 1 < len(parts) else ""), ""
    m = _WHAT_IS.match(question)
    if m and _OPERATOR.search(_clean_math(m["e"])) and safe_eval(_clean_math(m["e"])):
        return _clean_math(m["e"]), _first_number(parts[-1]), ""
    return None, None, "no_calculation"


def _number(text: str | None) -> Fraction | None:
    """A ground truth as a number ("1,000", "12.50"), or None if it is not one."""
    try:
        return Fraction(str(text).replace(",", "").strip()) if text is not None else None
    except (ValueError, ZeroDivisionError):
        return None


def _first_number(text: str) -> Fraction | None:
    m = _NUMBER.search(_clean_math(text.split("\n")[0]))
    return Fraction(m[0]) if m else None


def answer_of(v: Fraction | None) -> tuple[str | None, str]:
    """(ground truth, "") of a calculation's value, or (None, why it is not usable)."""
    if v is None or v <= 0:
        return None, "nonpositive_answer"  # a story's count or amount is never <= 0
    return (format_number(v), "") if format_number(v) else (None, "inexact_answer")


def renumber(question: str, expr: str, rng: random.Random) -> tuple[str, str] | None:
    """`question` with every number replaced by a larger one, and its answer by `expr`."""
    values = sorted(numbers_in(question))
    if any((v * 100).denominator != 1 for v in values):
        return None
    whole = (safe_eval(expr) or Fraction(1, 3)).denominator == 1
    for _ in range(200):  # redraw until the answer is usable, and whole if it was (division)
        new = {v: _larger(v, rng) for v in values}
        value = safe_eval(_substitute(_NUMBER, expr, new, lambda v: f"({v})"))
        truth, _ = answer_of(value)
        if truth and len(set(new.values())) == len(new) and not (whole and "." in truth):
            return _substitute(_RAW_NUMBER, question, new, format_number), truth
    return None


def _larger(v: Fraction, rng: random.Random) -> Fraction:
    """A number above `v`, up to about four times it, in whole units or cents like `v`."""
    unit = Fraction(1) if v.denominator == 1 else Fraction(1, 100)
    steps = int(v / unit)
    return unit * rng.randint(steps + 1, max(steps + 9, 4 * steps))


def _substitute(pattern: re.Pattern[str], text: str, new: dict[Fraction, Fraction],
                fmt: Any) -> str:
    def swap(m: re.Match[str]) -> str:
        v = Fraction(m[0].replace(",", ""))
        return str(fmt(new[v])) if v in new else m[0]

    return pattern.sub(swap, text)


def parse_proposal(text: str, seed: Seed, seen: set[str], cfg: dict[str, Any],
                   rng: random.Random) -> tuple[str, str, str] | str:
    """(question, ground truth, method) from one completion, or the reason it is dropped.

    Methods (see this module's docstring): computed, renumbered, model; only those listed in
    cfg["methods"] are kept.
    """
    m = _QUESTION.search(text)
    if not m or not m["q"].strip():
        return "unparsed"
    question = " ".join(m["q"].split())
    # The answer line, else the first line after the question: verification is what is strict.
    a = _ANSWER.search(m["rest"])
    answer = (a["a"] if a else next((x for x in m["rest"].splitlines() if x.strip()), ""))
    if not answer.strip():
        return "no_answer"
    expr, stated, reason = calculation(question, answer)
    used, value = (numbers_in(expr), safe_eval(expr)) if expr else (Counter(), None)
    if expr and used == numbers_in(seed.question) and value == _number(seed.truth):
        # The calculation solves the seed (its numbers, its answer), so the formula is known:
        # the seed's own text with larger numbers is a sound, harder task, whatever story
        # (often a garbled copy of the seed) the model wrote around it.
        new = renumber(seed.question, expr, rng)
        if new is None:
            return "renumber_failed"
        (question, truth), method = new, "renumbered"
    else:  # the model's own question
        if not int(cfg["min_question_chars"]) <= len(question) <= int(cfg["max_question_chars"]):
            return "bad_length"
        if "=" in question:
            return "solution_in_question"
        if numbers_in(question) and numbers_in(question) == numbers_in(seed.question):
            return "near_copy"  # the seed's numbers, not shown to reproduce its answer
        truth, method = None, "computed"
        if expr and used != numbers_in(question):
            reason = "numbers_mismatch"  # each number of the story used exactly once
        elif expr:
            truth, reason = answer_of(value)
            if truth is not None and stated != Fraction(truth):
                # A model that gets its own arithmetic wrong mostly chose the wrong operation.
                truth, reason = None, "wrong_result"
        if truth is None:  # the model's own final result, as it wrote it
            last = _first_number(answer.split("=")[-1])
            truth = (format_number(last) if last is not None else None) or answer.strip()
            method = "model"
    if normalise(question) in seen:
        return "copy"
    if method not in cfg["methods"]:
        return reason if method == "model" else f"{method}_not_kept"
    seen.add(normalise(question))
    return question, truth, method

