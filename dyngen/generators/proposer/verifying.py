"""Verifying a model-written task by self-consistency: a solver answers it without the label.

The solver (by default the proposer's own model; the `solver_*` keys configure another,
in-process or served: dyngen.llm) sees only the new question, in a few-shot chat of worked
single-formula solutions, and answers it `verify_samples` times (temperature
`verify_temperature`). Each answer's calculation is evaluated exactly (arithmetic.py), so
the solver's arithmetic slips do not count, only how it reads the story; an answer without
a calculation counts as its number. The task is verified when the most common answer is
the proposed ground truth, strictly ahead of any other, and at least `verify_agreement` of
the samples give it.
All tasks of a pass go to the solver in one call.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from dyngen.generators.proposer.arithmetic import as_number, clean_math, first_number, safe_eval
from dyngen.llm import ChatModel, ChatRequest, ChatResult, Message, seed_int

SOLVER_SYSTEM = ("You solve math word problems. Reply in exactly this format:\n"
                 "Answer: <one calculation with the problem's numbers> = <result>")
SOLVER_SHOTS = (
    ("Ann has 14 pens and buys 29 more. How many pens does she have?", "14 + 29 = 43"),
    ("Joe had 145 cards and lost 68. How many cards are left?", "145 - 68 = 77"),
    ("A crate has 12 eggs. How many eggs are in 17 crates?", "12 * 17 = 204"),
    ("156 stamps are shared by 12 kids. How many does each kid get?", "156 / 12 = 13"),
    ("Mia buys 3 boxes of 20 crayons and gives away 15 crayons. How many crayons does she "
     "have left?", "3 * 20 - 15 = 45"),
)


@dataclass(frozen=True)
class Verdict:
    """The solver's votes on one task: the share that gave the label, and the outcome."""

    agreement: float
    verified: bool


def solver_shots() -> list[Message]:
    """The fixed start of every solver prompt: the format, then worked solutions."""
    out = [{"role": "system", "content": SOLVER_SYSTEM}]
    for question, answer in SOLVER_SHOTS:
        out += [{"role": "user", "content": question},
                {"role": "assistant", "content": f"Answer: {answer}"}]
    return out


def solution_value(text: str) -> Fraction | None:
    """The value of one solver reply: its first calculation, exactly, else its first number."""
    line = text.split("Answer:", 1)[-1].split("\n")[0]
    for segment in line.split("=")[:-1]:
        value = safe_eval(clean_math(segment))
        if value is not None:
            return value
    return first_number(line)


def vote(answers: list[Fraction | None], truth: str, agreement: float) -> Verdict:
    """Whether `truth` is the strict majority answer and given by `agreement` of the votes."""
    label = as_number(truth)
    counts = Counter(a for a in answers if a is not None)
    share = counts[label] / len(answers) if answers and label is not None else 0.0
    runner_up = max((c for a, c in counts.items() if a != label), default=0)
    return Verdict(round(share, 4), bool(answers) and label is not None
                   and counts[label] > runner_up and share >= agreement)


def verify(solver: ChatModel, questions: list[str], truths: list[str], cfg: dict[str, Any],
           stream: tuple[Any, ...]) -> tuple[list[Verdict], list[ChatResult]]:
    """(a verdict per task, the solver's results): each task solved verify_samples times.

    A task whose request failed is not verified (its result says why).
    """
    if not questions:
        return [], []
    shots = solver_shots()
    results = solver.complete([
        ChatRequest([*shots, {"role": "user", "content": q}], n=int(cfg["verify_samples"]),
                    max_tokens=int(cfg["max_new_tokens"]),
                    temperature=float(cfg["verify_temperature"]), top_p=float(cfg["top_p"]),
                    seed=seed_int("verify", *stream, i), stop=("\n",))
        for i, q in enumerate(questions)])
    agreement = float(cfg["verify_agreement"])
    verdicts = [vote([solution_value(r) for r in result.texts], truth, agreement)
                if result.ok else Verdict(0.0, False)
                for result, truth in zip(results, truths, strict=True)]
    return verdicts, results
