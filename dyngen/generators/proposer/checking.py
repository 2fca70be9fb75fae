"""Parsing: what task a completion proposes, with what ground truth and method, or why none.

A completion is a task only if its question parses, has min..max_question_chars, holds no
"=", and is (normalised) neither a seed nor an earlier proposal. Its ground truth is
*computed* where it can be, never copied from the model (arithmetic.py evaluates exactly).
The answer's first calculation decides the `method`:
  renumbered  it uses exactly the seed's numbers and gives the seed's known answer: the
              formula is the seed's, so the seed's own text with larger numbers, and the
              answer recomputed (renumbering.py), is a sound harder task — verified by
              construction (the model's rewordings of a seed are often garbled, so its text
              is not used);
  arithmetic  the question is only arithmetic ("What is 17 * 3?"): its label is its exact
              value, whatever the model answered — verified by construction;
  computed    it uses exactly the question's numbers, each as often, and the model's own
              result for it is right (else "wrong_result": the model mostly chose the wrong
              operation too). The arithmetic is exact, but whether the calculation fits the
              story is not known here: a 135M model often picks the wrong one, so the
              generator keeps such a task only if asked to, after verifying.py's check, or
              explicitly unverified (`unverified_methods`);
  model       anything else, with the model's own final number: verified the same way.
A model-written question that no calculation over its own numbers can answer (it mixes time
units, or asks for money and states none) is dropped before any verification.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from dyngen.generators.proposer.arithmetic import (
    OPERATOR,
    answer_of,
    as_number,
    clean_math,
    first_number,
    format_number,
    numbers_in,
    safe_eval,
)
from dyngen.generators.proposer.renumbering import renumber
from dyngen.generators.proposer.text import normalise

if TYPE_CHECKING:
    from dyngen.generators.proposer.seeds import Seed

_QUESTION = re.compile(r"Question:[ \t]*(?P<q>[^\n]*)(?P<rest>.*)", re.S | re.I)
_ANSWER = re.compile(r"Answer:[ \t]*(?P<a>[^\n]*)", re.I)
_TIME_UNIT = re.compile(r"\b(second|minute|hour|day|week|month|year)s?\b", re.I)
_ASKS_MONEY = re.compile(r"\bhow much\b(?:(?!\?).)*\b(?:money|spen[dt]|earns?|earned|make|made|"
                         r"costs?|pay|paid|sav(?:e|ed)|charge)", re.I)
_MONEY = re.compile(r"[$€£]|\b(?:dollars?|cents?|euros?|pounds?)\b", re.I)
_WHAT_IS = re.compile(r"\s*(?:what is|what's|compute|calculate|evaluate)\s+(?:the value of\s+)?"
                      r"(?P<e>[-\d\s.,+*/×÷x()]+?)\s*(?:\?|\.|$)", re.I)


def calculation(question: str, answer: str) -> tuple[str | None, Fraction | None, str]:
    """(the answer's first calculation, the model's result for it, "") or (None, None, why).

    Later calculations restate or wander. A question "What is <arithmetic>?" answered
    without a calculation is its own calculation.
    """
    parts = answer.split("=")
    for i, segment in enumerate(parts[:-1] or parts):
        expr = clean_math(segment)
        if OPERATOR.search(expr):
            if safe_eval(expr) is None:
                return None, None, "bad_calculation"
            return expr, first_number(parts[i + 1] if i + 1 < len(parts) else ""), ""
    m = _WHAT_IS.match(question)
    if m and OPERATOR.search(clean_math(m["e"])) and safe_eval(clean_math(m["e"])):
        return clean_math(m["e"]), first_number(parts[-1]), ""
    return None, None, "no_calculation"


@dataclass(frozen=True)
class Proposal:
    """What one completion became: its method, and a task or the reason it is dropped.

    `method` is "unparsed" when no question and answer could be read. `note` says why a
    "model" task's truth is the model's own (e.g. "wrong_result").
    """

    method: str
    question: str | None = None
    truth: str | None = None
    reason: str = ""
    note: str = ""

    @property
    def ok(self) -> bool:
        """Whether the completion is a task (its label still to be verified by the policy)."""
        return not self.reason


def pure_arithmetic(question: str) -> Fraction | None:
    """The exact value of a question that is only arithmetic ("What is 17 * 3?"), else None."""
    m = _WHAT_IS.fullmatch(question)
    expr = clean_math(m["e"]) if m else ""
    return safe_eval(expr) if OPERATOR.search(expr) else None


def parse_proposal(text: str, seed: Seed, seen: set[str], cfg: dict[str, Any],
                   rng: random.Random) -> Proposal:
    """The task one completion proposes (question, ground truth, method), or why it is none.

    Methods (see this module's docstring): renumbered, arithmetic, computed, model. Which are
    kept, and after what verification, is the generator's policy, not decided here.
    """
    m = _QUESTION.search(text)
    if not m or not m["q"].strip():
        return Proposal("unparsed", reason="unparsed")
    question = " ".join(m["q"].split())
    # The answer line, else the first line after the question: verification is what is strict.
    a = _ANSWER.search(m["rest"])
    answer = (a["a"] if a else next((x for x in m["rest"].splitlines() if x.strip()), ""))
    if not answer.strip():
        return Proposal("unparsed", reason="no_answer")
    expr, stated, note = calculation(question, answer)
    used, value = (numbers_in(expr), safe_eval(expr)) if expr else (Counter(), None)
    if expr and used == numbers_in(seed.question) and value == as_number(seed.truth):
        # The calculation solves the seed (its numbers, its answer), so the formula is known:
        # the seed's own text with larger numbers is a sound, harder task, whatever story
        # (often a garbled copy of the seed) the model wrote around it.
        new, why = renumber(seed.question, expr, rng)
        if new is None:
            return Proposal("renumbered", reason=why)
        return _unseen(Proposal("renumbered", *new), seen)
    if (arith := pure_arithmetic(question)) is not None:
        # The question is its own calculation: its label is its value, whatever was answered.
        truth, why = answer_of(arith)
        if truth is None or not 3 <= len(question) <= int(cfg["max_question_chars"]):
            return Proposal("arithmetic", question, truth, why or "bad_length")
        return _unseen(Proposal("arithmetic", question, truth), seen)
    # The model's own question.
    truth = None
    if expr and used != numbers_in(question):
        note = "numbers_mismatch"  # each number of the story used exactly once
    elif expr:
        truth, note = answer_of(value)
        if truth is not None and stated != Fraction(truth):
            # A model that gets its own arithmetic wrong mostly chose the wrong operation.
            truth, note = None, "wrong_result"
    method = "computed" if truth is not None else "model"
    if truth is None:  # the model's own final result, as it wrote it
        last = first_number(answer.split("=")[-1])
        truth = (format_number(last) if last is not None else None) or answer.strip()
    if not int(cfg["min_question_chars"]) <= len(question) <= int(cfg["max_question_chars"]):
        return Proposal(method, question, truth, "bad_length", note)
    if "=" in question:
        return Proposal(method, question, truth, "solution_in_question", note)
    if numbers_in(question) and numbers_in(question) == numbers_in(seed.question):
        # The seed's numbers, not shown to reproduce its answer.
        return Proposal(method, question, truth, "near_copy", note)
    if why := story_mismatch(question):
        return Proposal(method, question, truth, why, note)
    return _unseen(Proposal(method, question, truth, note=note), seen)


def story_mismatch(question: str) -> str:
    """Why no single calculation over a question's own numbers can answer it, or "".

    A model-written task's truth uses only the numbers its question states, so a question
    that mixes time units (15 pages a minute for 2 hours) lacks the conversion, and one that
    asks for money but states no amount of it lacks the price.
    """
    if len({u.lower() for u in _TIME_UNIT.findall(question)}) > 1:
        return "mixed_units"
    if _ASKS_MONEY.search(question) and not _MONEY.search(question):
        return "no_price"
    return ""


def _unseen(p: Proposal, seen: set[str]) -> Proposal:
    """`p`, or `p` dropped as a "copy" if its question is a seed or an earlier proposal."""
    return replace(p, reason="copy") if normalise(p.question or "") in seen else p
