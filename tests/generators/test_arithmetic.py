"""The arithmetic curriculum: exact answers, and difficulty that follows the score
across restarts, remembered in the dataset's lineage."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from dyngen.generators.arithmetic import LEVELS, ArithmeticCurriculum, arithmetic_task, evaluate
from dyngen.round import RoundContext, Trigger
from dyngen.store import Store
from tests.generators.contract import GeneratorContract


class TestArithmeticCurriculum(GeneratorContract):
    def make_generator(self) -> ArithmeticCurriculum:
        return ArithmeticCurriculum({"tasks_per_round": 5})


def recomputed(row: dict[str, Any]) -> int:
    """The answer of a task's question, computed independently of the generator."""
    expression = row["prompt"][-1]["content"].removeprefix("What is ").rstrip("?")
    return eval(expression, {"__builtins__": {}})  # noqa: S307 - digits and + - * only


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_every_ground_truth_is_the_true_answer(level: int) -> None:
    rng = random.Random(level)
    for i in range(200):
        row = arithmetic_task(rng, i, level)
        assert int(row["reward_model"]["ground_truth"]) == recomputed(row)
        digits, ops, operands = LEVELS[level]
        numbers = row["prompt"][-1]["content"][8:-1].split()[::2]
        assert len(numbers) == operands and all(len(n) <= digits for n in numbers)


def test_evaluate_respects_precedence() -> None:
    assert evaluate("2 + 3 * 4 - 5") == 9
    assert evaluate("7 - 2 - 1") == 4


def _context(round_no: int, score: float | None, previous: dict | None) -> RoundContext:
    metrics = {} if score is None else {"score": score}
    return RoundContext("ds", round_no, round_no - 1, Trigger(metrics=metrics), previous)


def test_deterministic_for_a_seed_and_round(seed_dataset) -> None:
    gen = ArithmeticCurriculum({"seed": 3})
    first = gen.generate(seed_dataset, _context(4, 0.9, {"level": 2})).to_list()
    again = ArithmeticCurriculum({"seed": 3}).generate(
        seed_dataset, _context(4, 0.9, {"level": 2})).to_list()
    other = ArithmeticCurriculum({"seed": 3}).generate(
        seed_dataset, _context(5, 0.9, {"level": 2})).to_list()
    assert first == again != other


@pytest.fixture
def seed_dataset():
    from tests.generators.contract import make_seed_dataset

    return make_seed_dataset()


@pytest.mark.usefixtures("prefect_server")
def test_level_follows_the_score_across_restarts(tmp_path: Path) -> None:
    """Each round runs with a freshly built generator (as after a restart): the level can
    only come from the lineage of the dataset's earlier versions."""
    from dyngen.flows.generation_round import generation_round

    store = Store(tmp_path)
    store.create("ds", [arithmetic_task(random.Random(0), i, 1, "seed") for i in range(4)])
    config = {"store": {"root": str(tmp_path)},
              "data": {"datagen": {"path": "pkg://dyngen.generators.arithmetic",
                                   "name": "ArithmeticCurriculum", "tasks_per_round": 4}}}
    scores = [0.9, 0.95, 0.8, 0.2, 0.1, None]
    for step, score in enumerate(scores, start=1):
        metrics = {} if score is None else {"score": score}
        generation_round("ds", config, {"step": step, "metrics": metrics})
    levels = [r.lineage["generator"]["state"]["level"] for r in store.history("ds")[1:]]
    assert levels == [2, 3, 4, 3, 2, 2]
    rows = store.load("ds").to_list()[4:]
    assert [r["extra_info"]["level"] for r in rows[::4]] == levels
    assert all(int(r["reward_model"]["ground_truth"]) == recomputed(r) for r in rows)
