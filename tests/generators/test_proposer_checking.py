"""The proposer without its model: seeds, parsing, exact verification, renumbering."""

from __future__ import annotations

import random
import re
from fractions import Fraction
from pathlib import Path
from typing import Any

import datasets
import pytest

from dyngen.rollouts import RolloutsPolicy
from generators.proposer import (
    ProposerGenerator,
    Seed,
    normalise,
    parse_proposal,
    renumber,
    safe_eval,
    seeds_from_dataset,
    seeds_from_rollouts,
)
from tests.generators.proposer_tasks import HARD, task_row, write_rollouts


def test_seeds_from_rollouts_average_repeats_and_rank_lowest_first(tmp_path: Path) -> None:
    path = write_rollouts(tmp_path / "r.jsonl")
    seeds = seeds_from_rollouts(RolloutsPolicy((str(tmp_path),)).read(str(path)), 3)
    assert [s.index for s in seeds] == [2, 3, 4]
    assert seeds[0].truth == "19" and seeds[0].score == pytest.approx(0.05)
    with pytest.raises(TypeError, match="not a path: pass context.read_rollouts()"):
        seeds_from_rollouts(str(path), 3)  # the one way to read a rollouts file is confined


def test_seeds_from_dataset_lowest_score_first_then_newest() -> None:
    rows = [task_row(i, f"Question number {i}?", "1") for i in range(6)]
    rows[1]["extra_info"]["score"], rows[3]["extra_info"]["score"] = 0.9, 0.2
    seeds = seeds_from_dataset(datasets.Dataset.from_list(rows), 4, window=5)
    assert [s.index for s in seeds] == [3, 1, 5, 4]  # row 0 is outside the window


@pytest.mark.parametrize("text,expected", [
    ("Question: Ann has 14 pens and buys 29 more. How many pens?\nAnswer: 14 + 29 = 43 pens",
     ("Ann has 14 pens and buys 29 more. How many pens?", "43", "computed")),
    ("Question: Ann has 14 pens and buys 29 more. How many pens?\nAnswer: 14 * 29 = 43",
     "wrong_result"),  # the model's own result disagrees with its calculation
    ("Question: What is 17 * 3?\nAnswer: 51", ("What is 17 * 3?", "51", "computed")),
    ("Question: A box has 24 pens. How many pens are in 6 boxes?\nAnswer: 24 / 6 = 4",
     "near_copy"),  # the seed's numbers, and not the seed's answer
    ("Question: How many chairs are in 15 rows?\nAnswer: 15 * 12 = 180", "numbers_mismatch"),
    ("Question: Ann has 5 pens. She has 5 + 3 = 8. How many?\nAnswer: 8", "solution_in_question"),
    ("Question: Ann had 3 pens and lost 9. How many are left?\nAnswer: 3 - 9 = -6",
     "nonpositive_answer"),
    ("Question: A box holds 24 pencils. How many pencils are in 6 boxes?\nAnswer: 144",
     "near_copy"),  # a copy of the seed that does not show how to solve it
    ("Question: How many pens?\nAnswer: 2 + 2 = 4", "bad_length"),
    ("Just some text without the format.", "unparsed"),
    ("Question: Ann has 5 pens and buys 3 more.\nAnswer: __import__('os') = 1",
     "no_calculation"),
])
def test_parse_and_validate(text: str, expected: Any) -> None:
    seed = Seed(0, "A box holds 24 pencils. How many pencils are in 6 boxes?", 0.1, "144")
    cfg = {"min_question_chars": 15, "max_question_chars": 300,
           "methods": ("computed", "renumbered")}
    seen = {normalise(seed.question)}
    got = parse_proposal(text, seed, seen, cfg, random.Random(0))
    assert got == expected


@pytest.mark.parametrize("text", [
    "Question: There are 15 rows with 12 chairs. How many chairs?\nAnswer: 12 * 15 = 170",
    f"Question: {HARD[4][0]}\nAnswer: 15 * 12 = 180",  # a copy that shows the formula
    "Question: How many chairs are in 15 rows?\nAnswer: 15 * 12 = 175",  # the story is lost
])
def test_a_calculation_that_solves_the_seed_renumbers_the_seeds_text(text: str) -> None:
    seed = Seed(4, HARD[4][0], 0.1, HARD[4][1])  # 15 rows of 12 chairs: 180
    question, truth, method = parse_proposal(
        text, seed, set(), {"min_question_chars": 5, "max_question_chars": 300,
                            "methods": ("renumbered",)}, random.Random(0))
    rows, chairs = (int(n) for n in re.findall(r"\d+", question))
    assert method == "renumbered" and rows > 15 and chairs > 12
    assert truth == str(rows * chairs)
    assert question == (f"There are {rows} rows of chairs with {chairs} chairs in each row. "
                        "How many chairs are there?")


def test_methods_choose_what_is_kept() -> None:
    seed = Seed(0, HARD[0][0], 0.1, HARD[0][1])
    text = "Question: Ann has 14 pens and buys 29 more. How many pens?\nAnswer: 14 + 29 = 43"
    cfg = {"min_question_chars": 5, "max_question_chars": 300}
    parse = lambda methods, t=text: parse_proposal(  # noqa: E731
        t, seed, set(), {**cfg, "methods": methods}, random.Random(0))
    assert parse(("renumbered",)) == "computed_not_kept"
    assert parse(("computed",))[2] == "computed"
    guess = "Question: Ann has some pens and buys more. How many pens?\nAnswer: about 40"
    assert parse(("computed",), guess) == "no_calculation"
    assert parse(("model",), guess) == ("Ann has some pens and buys more. How many pens?",
                                        "40", "model")
    with pytest.raises(ValueError, match="methods: expected some of"):
        ProposerGenerator({"methods": ["guess"]}).settings()
    with pytest.raises(ValueError, match=r"unknown keys \['temprature'\]"):
        ProposerGenerator({"temprature": 0.5}).settings()


def test_renumbering_keeps_a_whole_answer_whole() -> None:
    for i in range(20):
        question, truth = renumber(HARD[3][0], "96 / 8", random.Random(i))
        cookies, bags = (int(n) for n in re.findall(r"\d+", question))
        assert cookies > 96 and bags > 8 and Fraction(cookies, bags) == int(truth)


@pytest.mark.parametrize("expr,value", [("2 + 3 * 4", 14), ("(1 + 2) / 4", Fraction(3, 4)),
                                        ("-5 + 2", -3), ("1 / 0", None), ("2 ** 10", None),
                                        ("__import__('os')", None), ("x + 1", None),
                                        ("9" * 200, None)])
def test_safe_eval_allows_only_arithmetic(expr: str, value: Any) -> None:
    assert safe_eval(expr) == value
