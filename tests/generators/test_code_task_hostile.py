"""Hostile input in code tasks: a proposal whose input cannot cross the sandbox is dropped as
unparsed, checking never raises, and rewards (verl's compute_score, TRL's code_task_reward)
score hostile answers 0.0 without raising inside a training step."""

from __future__ import annotations

import time

import pytest

from dyngen.generators.code_tasks.checking import check_candidates
from dyngen.generators.code_tasks.generator import CodeTaskProposer
from dyngen.generators.code_tasks.proposing import Candidate, parse_candidate
from dyngen.generators.code_tasks.reward import (
    code_task_reward,
    compute_score,
    final_answer,
    score,
)
from dyngen.generators.code_tasks.tasks import ABDUCTION


@pytest.mark.parametrize("argument", ["1e999", "-1e999", "float('nan')", "9" * 5000,
                                      "[" * 3000 + "]" * 3000],
                         ids=["inf", "-inf", "nan", "int", "deep"])
def test_a_proposal_whose_input_cannot_cross_is_unparsed(argument: str) -> None:
    text = f"```python\ndef f(x):\n    return x\n```\nInput: {argument}"
    assert parse_candidate(text, 2000, 100_000) == "unparsed"


def test_checking_an_unshowable_candidate_drops_it() -> None:
    cfg = CodeTaskProposer({}).settings()
    cands = [Candidate("def f(x):\n    return x * 2\n", "f", "inf", float("inf"))]
    (checked,) = check_candidates(cands, set(), cfg)
    assert checked.reason == "error"


@pytest.mark.parametrize("answer", ["1e999", "float('nan')", "9" * 5000, "9" * 4000,
                                    "[" * 3000 + "]" * 3000, "-" * 3000 + "1", "'x' * 9",
                                    repr("y" * 200_000)],
                         ids=["inf", "nan", "int-5000", "int-4000", "deep", "minus", "expr",
                              "long"])
def test_hostile_answers_score_zero_and_never_raise(answer: str) -> None:
    info = {"task": ABDUCTION, "program": "def f(x):\n    return x + 1\n", "function": "f",
            "input": "1", "output": "2"}
    solution = f"Thinking.\nAnswer: {answer}"
    assert score(solution, "2", info) == 0.0
    assert compute_score(data_source="d", solution_str=solution, ground_truth="2",
                         extra_info=info) == 0.0
    assert score(solution, "2", {"task": "deduction"}) == 0.0
    assert code_task_reward(prompts=["p"] * 2, completions=[solution] * 2,
                            reward_model=[{"ground_truth": "2"}] * 2,
                            extra_info=[info] * 2) == [0.0, 0.0]


@pytest.mark.parametrize("text", ["Answer: 1" + " " * 100_000 + "x", "Answer:" + " \t" * 100_000,
                                  "\\boxed{" * 20_000, "answer" + " " * 100_000 + "x"],
                         ids=["spaces-then-text", "trailing-blanks", "boxed", "no-colon"])
def test_reading_the_answer_of_a_long_completion_is_linear(text: str) -> None:
    """Patterns that backtrack took seconds on 20,000 characters (quadratic)."""
    start = time.perf_counter()
    final_answer(text)
    assert time.perf_counter() - start < 1.0


def test_parsing_a_long_proposal_is_linear() -> None:
    """The input line's pattern took 9 s on a line of 20,000 blanks (quadratic)."""
    text = "def f(x):\n    return x\nInput: 1" + " " * 20_000 + "x"
    start = time.perf_counter()
    assert parse_candidate(text, 2000, 300) == "unparsed"
    assert time.perf_counter() - start < 1.0
