"""The proposer without its model: seeds, parsing, exact arithmetic, renumbering, voting."""

from __future__ import annotations

import random
import re
from fractions import Fraction
from pathlib import Path
from typing import Any

import datasets
import pytest

from dyngen.generators.proposer import (
    Proposal,
    ProposerGenerator,
    Seed,
    ambiguous,
    normalise,
    parse_proposal,
    renumber,
    safe_eval,
    seeds_from_dataset,
    seeds_from_rollouts,
    solution_value,
    vote,
)
from dyngen.generators.proposer.seeds import min_rows_share, round_seeds
from dyngen.round.context import RoundContext, Trigger
from dyngen.round.rollouts import RolloutsPolicy
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


def test_each_partition_of_a_round_takes_every_pth_seed_and_its_share_of_min_rows(
        tmp_path: Path) -> None:
    # Both the proposer and the code proposer choose a round's seeds through round_seeds.
    path = write_rollouts(tmp_path / "r.jsonl")
    cfg = {"hard_k": 3, "seed_window": 64, "min_rows": None}
    whole = round_seeds(cfg, datasets.Dataset.from_list([]), RoundContext(
        "ds", 1, 0, Trigger(rollouts=str(path)), rollouts_policy=RolloutsPolicy((str(tmp_path),))))
    assert [s.index for s in whole] == [2, 3, 4]
    parts = [round_seeds(cfg, datasets.Dataset.from_list([]), RoundContext(
        "ds", 1, 0, Trigger(rollouts=str(path)), partition=p, partitions=2,
        rollouts_policy=RolloutsPolicy((str(tmp_path),)))) for p in range(2)]
    assert [[s.index for s in part] for part in parts] == [[2, 4], [3]]
    assert min_rows_share(cfg, RoundContext("ds", 1, 0, Trigger(), partitions=2)) == 2
    assert min_rows_share({**cfg, "min_rows": 8}, None) == 8


def shape(p: Proposal) -> Any:
    """A task as (question, truth, method), a dropped completion as its reason."""
    return (p.question, p.truth, p.method) if p.ok else p.reason


@pytest.mark.parametrize("text,expected", [
    ("Question: Ann has 14 pens and buys 29 more. How many pens?\nAnswer: 14 + 29 = 43 pens",
     ("Ann has 14 pens and buys 29 more. How many pens?", "43", "computed")),
    ("Question: What is 17 * 3?\nAnswer: 51", ("What is 17 * 3?", "51", "arithmetic")),
    # A question that is only arithmetic is labelled with its own value, not the answer's.
    ("Question: What is 17 * 3?\nAnswer: 17 + 3 = 20", ("What is 17 * 3?", "51", "arithmetic")),
    ("Question: A box has 24 pens. How many pens are in 6 boxes?\nAnswer: 24 / 6 = 4",
     "near_copy"),  # the seed's numbers, and not the seed's answer
    ("Question: Ann has 5 pens. She has 5 + 3 = 8. How many?\nAnswer: 8", "solution_in_question"),
    ("Question: A box holds 24 pencils. How many pencils are in 6 boxes?\nAnswer: 144",
     "near_copy"),  # a copy of the seed that does not show how to solve it
    ("Question: How many pens?\nAnswer: 2 + 2 = 4", "bad_length"),
    ("Just some text without the format.", "unparsed"),
    ("Question: Ann has 14 pens.\n", "no_answer"),
    # No calculation over the question's own numbers answers these: a unit conversion or a
    # price is missing, so the computed truth cannot be right.
    ("Question: A printer prints 15 pages per minute. How many pages in 2 hours?\n"
     "Answer: 15 * 2 = 30", "mixed_units"),
    ("Question: Sam sold 48 cupcakes and 36 muffins. How much money did he make?\n"
     "Answer: 48 + 36 = 84", "no_price"),
])
def test_parse_and_validate(text: str, expected: Any) -> None:
    seed = Seed(0, "A box holds 24 pencils. How many pencils are in 6 boxes?", 0.1, "144")
    cfg = {"min_question_chars": 15, "max_question_chars": 300}
    seen = {normalise(seed.question)}
    assert shape(parse_proposal(text, seed, seen, cfg, random.Random(0))) == expected


@pytest.mark.parametrize("text,truth,note", [
    # The model's own result disagrees with its calculation: its number, and why.
    ("Question: Ann has 14 pens and buys 29 more. How many pens?\nAnswer: 14 * 29 = 43",
     "43", "wrong_result"),
    ("Question: How many chairs are in 15 rows?\nAnswer: 15 * 7 = 105", "105",
     "numbers_mismatch"),
    ("Question: Ann had 3 pens and lost 9. How many are left?\nAnswer: 3 - 9 = -6", "6",
     "nonpositive_answer"),
    ("Question: Ann has 5 pens and buys 3 more.\nAnswer: __import__('os') = 1", "1",
     "no_calculation"),
])
def test_a_task_whose_truth_is_not_computed_is_method_model(text: str, truth: str,
                                                            note: str) -> None:
    seed = Seed(0, HARD[1][0], 0.1, HARD[1][1])
    got = parse_proposal(text, seed, set(), {"min_question_chars": 15,
                                             "max_question_chars": 300}, random.Random(0))
    assert (got.ok, got.method, got.truth, got.note) == (True, "model", truth, note)


@pytest.mark.parametrize("text", [
    "Question: There are 15 rows with 12 chairs. How many chairs?\nAnswer: 12 * 15 = 170",
    f"Question: {HARD[4][0]}\nAnswer: 15 * 12 = 180",  # a copy that shows the formula
    "Question: How many chairs are in 15 rows?\nAnswer: 15 * 12 = 175",  # the story is lost
])
def test_a_calculation_that_solves_the_seed_renumbers_the_seeds_text(text: str) -> None:
    seed = Seed(4, HARD[4][0], 0.1, HARD[4][1])  # 15 rows of 12 chairs: 180
    got = parse_proposal(text, seed, set(), {"min_question_chars": 5,
                                             "max_question_chars": 300}, random.Random(0))
    rows, chairs = (int(n) for n in re.findall(r"\d+", got.question or ""))
    assert got.method == "renumbered" and rows > 15 and chairs > 12
    assert got.truth == str(rows * chairs)
    assert got.question == (f"There are {rows} rows of chairs with {chairs} chairs in each "
                            "row. How many chairs are there?")


def test_settings_name_the_policy_and_refuse_what_they_cannot_do() -> None:
    cfg = ProposerGenerator({}).settings()
    assert list(cfg["methods"]) == ["renumbered", "arithmetic"]
    assert not cfg["unverified_methods"]
    with pytest.raises(ValueError, match="methods: expected a list of some of"):
        ProposerGenerator({"methods": ["guess"]}).settings()
    with pytest.raises(ValueError, match="unverified_methods: expected .* computed, model"):
        ProposerGenerator({"unverified_methods": ["renumbered"]}).settings()
    with pytest.raises(ValueError, match="verify_samples >= 1"):
        ProposerGenerator({"verify_samples": 0}).settings()
    with pytest.raises(ValueError, match="verify_agreement <= 1"):
        ProposerGenerator({"verify_agreement": 1.5}).settings()
    with pytest.raises(ValueError, match=r"unknown keys \['temprature'\]"):
        ProposerGenerator({"temprature": 0.5}).settings()


def test_renumbering_keeps_a_whole_answer_whole() -> None:
    for i in range(20):
        (question, truth), _ = renumber(HARD[3][0], "96 / 8", random.Random(i))
        cookies, bags = (int(n) for n in re.findall(r"\d+", question))
        assert cookies > 96 and bags > 8 and Fraction(cookies, bags) == int(truth)


def test_renumbering_keeps_every_step_of_the_formula_whole_and_positive() -> None:
    seed = "A baker packs 96 cookies into 8 bags and sells 3 bags. How many cookies are sold?"
    for i in range(20):
        (question, truth), _ = renumber(seed, "96 / 8 * 3", random.Random(i))
        cookies, bags, sold = (int(n) for n in re.findall(r"\d+", question))
        assert cookies % bags == 0 and cookies // bags * sold == int(truth)  # whole bags
        (question, truth), _ = renumber("Joe had 45 cards, lost 18 and bought 7. How many?",
                                        "45 - 18 + 7", random.Random(i))
        had, lost, bought = (int(n) for n in re.findall(r"\d+", question))
        assert had > lost and had - lost + bought == int(truth)


@pytest.mark.parametrize("question,expr,check", [
    ("A shop sold 30% of its 120 shirts. How many shirts did it sell?", "30 * 120 / 100",
     lambda nums: nums[0] <= 100),  # a percentage stays a percentage
    ("Kevin works 5 days a week for 3 weeks. How many days does he work?", "5 * 3",
     lambda nums: nums[0] <= 7),
    ("Sue sleeps 8 hours a day for 9 days. How many hours does she sleep?", "8 * 9",
     lambda nums: nums[0] <= 24),
    ("There are 7 days in a week. Jake runs 5 miles a day. How many miles in a week?",
     "7 * 5", lambda nums: nums[0] == 7),  # a unit conversion never changes
    ("A show starts at 3 pm and has 4 acts of 20 minutes. How long is it in minutes?",
     "4 * 20", lambda nums: nums[0] == 3),
])
def test_renumbering_keeps_the_story_possible(question: str, expr: str, check: Any) -> None:
    for i in range(20):
        new, why = renumber(question, expr, random.Random(i))
        assert new is not None, why
        nums = [int(n) for n in re.findall(r"\d+", new[0])]
        assert check(nums), new[0]


def test_a_formula_another_one_could_stand_for_is_not_renumbered() -> None:
    # 4 - 2 = 4 / 2 = 2: which one the seed means is not known, so renumbering could lie.
    assert ambiguous("4 - 2") and ambiguous("2 + 2") and not ambiguous("45 - 18")
    assert not ambiguous("3 * 12 - 9") and not ambiguous("1250 + 340 - 175")
    assert renumber("Ann had 4 pens and lost 2. How many are left?", "4 - 2",
                    random.Random(0)) == (None, "ambiguous_formula")
    assert renumber("Add 2 and 3 and 4 and 5 and 6.", "2 + 3 + 4 + 5 + 6",
                    random.Random(0)) == (None, "formula_unchecked")


@pytest.mark.parametrize("reply,value", [
    ("Answer: 11 + 15 = 27 cows", 26),  # its calculation, exactly, not its arithmetic slip
    ("Answer: 3 * 20 - 15 = 45", 45), ("Answer: about 40 cows", 40),
    ("Answer: 5 / 2 = 2", Fraction(5, 2)), ("no answer at all", None),
])
def test_a_solver_reply_is_worth_its_calculation(reply: str, value: Any) -> None:
    assert solution_value(reply) == value


@pytest.mark.parametrize("answers,verified,agreement", [
    ([26, 26, 26, 4, None], True, 0.6),
    ([26, 26, 4, 4, 9], False, 0.4),  # a tie is not a majority
    ([26, 26, 4, None, None], False, 0.4),  # the most common, but below the agreement
    ([4, 4, 4, 26, 26], False, 0.4),
    ([None] * 5, False, 0.0),
])
def test_a_label_is_verified_only_by_a_clear_majority(answers: list[Any], verified: bool,
                                                      agreement: float) -> None:
    got = vote([None if a is None else Fraction(a) for a in answers], "26", 0.6)
    assert (got.verified, got.agreement) == (verified, agreement)


@pytest.mark.parametrize("expr,value", [("2 + 3 * 4", 14), ("(1 + 2) / 4", Fraction(3, 4)),
                                        ("-5 + 2", -3), ("1 / 0", None), ("2 ** 10", None),
                                        ("__import__('os')", None), ("x + 1", None),
                                        ("9" * 200, None)])
def test_safe_eval_allows_only_arithmetic(expr: str, value: Any) -> None:
    assert safe_eval(expr) == value
