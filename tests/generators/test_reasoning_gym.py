"""ReasoningGymCurriculum: the generator contract, its settings and bad input, levels moved by
the batch's rewards with reasoning-gym's curriculum, and entries stored without loss."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from dyngen.errors import ConfigError
from dyngen.generators.reasoning_gym import ReasoningGymCurriculum
from dyngen.generators.reasoning_gym.decisions import (
    DEMOTED,
    HELD,
    PROMOTED,
    decide,
    fresh_memory,
    moved,
)
from dyngen.generators.reasoning_gym.families import Family, decode_entry, encode_entry
from dyngen.generators.reasoning_gym.generator import shares
from dyngen.round.context import RoundContext, Trigger
from dyngen.round.rollouts import RolloutsPolicy
from tests.generators.contract import GeneratorContract, make_seed_dataset

TASKS = ["basic_arithmetic", "chain_sum", "leg_counting", "propositional_logic"]
CFG = {"promote_at": 0.8, "demote_at": 0.3, "window": 2}


class TestReasoningGymCurriculum(GeneratorContract):
    def make_generator(self) -> ReasoningGymCurriculum:
        return ReasoningGymCurriculum({"tasks": TASKS, "rows_per_round": 8})


def context(round_no: int, previous: dict[str, Any] | None = None,
            rollouts: Path | None = None) -> RoundContext:
    trigger = Trigger(step=round_no, rollouts=None if rollouts is None else str(rollouts))
    policy = RolloutsPolicy(() if rollouts is None else (str(rollouts.parent),))
    return RoundContext("ds", round_no, round_no - 1, trigger, previous, rollouts_policy=policy)


def test_an_unknown_family_fails_at_once_naming_close_matches() -> None:
    with pytest.raises(ConfigError, match="no task family 'chain_summ'.*Did you mean chain_sum"):
        ReasoningGymCurriculum({"tasks": ["basic_arithmetic", "chain_summ"]})


@pytest.mark.parametrize(("changes", "words"), [
    ({"tasks": None}, "expected a list of reasoning-gym family names"),
    ({"tasks": {"chain_sum": 0}}, "each weight a positive number"),
    ({"promote_at": 0.2}, "demote_at < promote_at"),
    ({"window": 0}, "at least 1"),
])
def test_bad_settings_say_what_was_expected(changes: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        ReasoningGymCurriculum({"tasks": ["chain_sum"], **changes})


def test_rows_are_split_by_weight_and_carry_what_the_scorer_needs() -> None:
    gen = ReasoningGymCurriculum({"tasks": {"chain_sum": 3, "leg_counting": 1},
                                  "rows_per_round": 10})
    rows = gen.generate(make_seed_dataset(), context(1)).to_list()
    families = [r["extra_info"]["reasoning_gym"]["family"] for r in rows]
    assert families.count("chain_sum") == 8 and families.count("leg_counting") == 2
    row = rows[0]
    assert row["data_source"] == "reasoning_gym/chain_sum"
    assert row["prompt"] == [{"role": "user", "content": row["prompt"][0]["content"]}]
    entry = decode_entry(row["extra_info"]["reasoning_gym"]["entry"])
    assert entry["question"] == row["prompt"][0]["content"]
    assert row["reward_model"]["ground_truth"] == entry["answer"]
    assert gen.stats["rows"] == {"chain_sum": {"0": 8}, "leg_counting": {"0": 2}}
    assert shares({"a": 1, "b": 1, "c": 1}, 10) == {"a": 4, "b": 3, "c": 3}


def test_rows_are_the_same_for_a_dataset_round_and_seed_and_differ_otherwise() -> None:
    def made(round_no: int, seed: int = 0) -> list[dict[str, Any]]:
        gen = ReasoningGymCurriculum({"tasks": ["chain_sum"], "rows_per_round": 4, "seed": seed})
        return gen.generate(make_seed_dataset(), context(round_no)).to_list()

    assert made(3) == made(3)
    assert made(3) != made(4) and made(3) != made(3, seed=1)


def test_entries_keep_tuples_and_integer_keys_exactly() -> None:
    entry = {"question": "q", "answer": None,
             "metadata": {"range": (1, 2), "colors": {0: 1, 3: 2}, "grid": ((1, 2), (3, 4)),
                          "nested": [{"k": (None, "x")}]}}
    text = encode_entry(entry)
    assert json.loads(text) and decode_entry(text) == entry
    with pytest.raises(ValueError, match="JSON cannot keep"):
        encode_entry({"question": "q", "answer": "a", "metadata": {"s": {1, 2}}})


def write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_a_full_window_of_good_rewards_promotes_with_reasonings_gyms_curriculum(
        tmp_path: Path) -> None:
    """Rollouts name their family by data_source, or only by prompt (found in the dataset)."""
    gen = ReasoningGymCurriculum({"tasks": ["chain_sum", "leg_counting"], "rows_per_round": 4,
                                  "window": 2})
    data = gen.generate(make_seed_dataset(), context(1))
    chain = [r for r in data.to_list() if r["data_source"] == "reasoning_gym/chain_sum"]
    legs = [r for r in data.to_list() if r["data_source"] == "reasoning_gym/leg_counting"]
    state = gen.state
    for round_no in (2, 3):
        records = [{"prompt": r["prompt"], "score": 1.0, "data_source": r["data_source"]}
                   for r in chain]
        records += [{"prompt": r["prompt"][0]["content"], "score": 0.5} for r in legs]
        path = write(tmp_path / f"b{round_no}.jsonl", records)
        gen = ReasoningGymCurriculum({"tasks": ["chain_sum", "leg_counting"],
                                      "rows_per_round": 4, "window": 2})
        gen.generate(data, context(round_no, state, path))
        state = gen.state
    assert gen.stats["decisions"]["chain_sum"]["decision"] == PROMOTED
    assert gen.stats["decisions"]["chain_sum"]["mean"] == 1.0
    assert gen.stats["decisions"]["leg_counting"] == {
        "decision": HELD, "mean": 0.5, "level": 0,
        "why": "mean 0.500 between demote_at and promote_at"}
    assert state["levels"] == {"chain_sum": 1, "leg_counting": 0}
    curriculum = Family("chain_sum")
    curriculum.start_at(state["levels"]["chain_sum"])
    assert curriculum.curriculum.get_attr_level("num_terms") == 1
    assert gen.stats["rows"]["chain_sum"] == {"1": 2}
    assert gen.stats["rollouts"] == {"read": 4, "used": 4, "other_level": 0, "no_family": 0}


def test_rollouts_of_rows_at_another_level_do_not_decide(tmp_path: Path) -> None:
    gen = ReasoningGymCurriculum({"tasks": ["chain_sum"], "rows_per_round": 2, "window": 1})
    data = gen.generate(make_seed_dataset(), context(1, {"levels": {"chain_sum": 3}}))
    old = {"prompt": "an older question", "score": 1.0, "data_source": "reasoning_gym/chain_sum",
           "extra_info": {"reasoning_gym": {"level": 1}}}
    path = write(tmp_path / "b.jsonl", [old, {"prompt": "What is 1 + 1?", "score": 0.0}])
    gen.generate(data, context(2, gen.state, path))
    assert gen.stats["rollouts"] == {"read": 2, "used": 0, "other_level": 1, "no_family": 1}
    assert gen.state["levels"]["chain_sum"] == 3


def test_a_level_fallen_from_is_tried_again_after_a_doubling_wait() -> None:
    memory, level, top = fresh_memory(), 2, 5
    assert decide(memory, level, top, (0.0, 4), CFG)[0] == HELD  # 1 of 2 batch ends
    assert decide(memory, level, top, (0.0, 4), CFG)[0] == DEMOTED
    memory.update(window=[], batch_ends=0, fell_from={"2": 1})
    level = 1
    decided = [decide(memory, level, top, (4.0, 4), CFG)[0] for _ in range(4)]
    assert decided == [HELD, HELD, HELD, PROMOTED]  # 2 * 2**1 batch ends at level 1
    moved(memory, PROMOTED, 1, 2)
    assert memory == {"window": [], "batch_ends": 0, "fell_from": {"2": 1}}
    moved(memory, DEMOTED, 2, 1)
    assert memory["fell_from"] == {"2": 2}  # the next try waits 2 * 2**2 batch ends
    moved(memory, PROMOTED, 2, 3)  # level 2 mastered after all: its falls are forgotten
    assert memory["fell_from"] == {}
    at_top = fresh_memory()
    assert decide(at_top, top, top, (4.0, 4), CFG) == (HELD, 1.0, "1 of 2 batch ends at this "
                                                                   "level")
    assert decide(at_top, top, top, (4.0, 4), CFG) == (HELD, 1.0, "at the top level")


def test_a_family_without_a_curriculum_is_said_once_and_stays_at_level_0(
        caplog: pytest.LogCaptureFixture) -> None:
    gen = ReasoningGymCurriculum({"tasks": ["acre", "list_functions", "chain_sum"],
                                  "rows_per_round": 3})
    with caplog.at_level(logging.WARNING):
        gen.generate(make_seed_dataset(), context(1))
    said = [r.getMessage() for r in caplog.records if "no curriculum" in r.getMessage()]
    assert said == ["ReasoningGymCurriculum: reasoning-gym has no curriculum for acre, "
                    "list_functions; they stay at their default configuration (level 0)."]
    assert gen.stats["no_curriculum"] == ["acre", "list_functions"]
    assert gen.state["levels"]["acre"] == 0


def test_a_family_that_raises_at_its_level_is_dropped_and_the_others_go_on() -> None:
    # caesar_cipher's curriculum asks for rotations its own config refuses from level 2.
    gen = ReasoningGymCurriculum({"tasks": ["caesar_cipher", "chain_sum"], "rows_per_round": 4})
    rows = gen.generate(make_seed_dataset(), context(1, {"levels": {"caesar_cipher": 2}}))
    assert {r["data_source"] for r in rows} == {"reasoning_gym/chain_sum"} and len(rows) == 2
    assert gen.stats["dropped"] == {"caesar_cipher": {
        "level": 2, "reason": "AssertionError: rotation must be in range [1,25]"}}
    assert gen.stats["decisions"]["caesar_cipher"]["decision"] == DEMOTED
    assert gen.state["levels"]["caesar_cipher"] == 1
    assert gen.state["memory"]["caesar_cipher"]["fell_from"] == {"2": 1}


def test_families_whose_labels_cannot_be_checked_write_no_rows() -> None:
    """rush_hour's entries have no answer (its scorer simulates any), game_of_life_halting's
    scorer (reasoning-gym 0.1.25) gives 1.0 to any non-empty answer: neither can label."""
    gen = ReasoningGymCurriculum({"tasks": ["rush_hour", "game_of_life_halting", "chain_sum"],
                                  "rows_per_round": 6})
    rows = gen.generate(make_seed_dataset(), context(1))
    assert {r["data_source"] for r in rows} == {"reasoning_gym/chain_sum"}
    assert gen.stats["unproved_labels"] == {"rush_hour": 2, "game_of_life_halting": 2}


def test_partitions_write_their_shares_with_seeds_of_their_own() -> None:
    def share(partition: int) -> ReasoningGymCurriculum:
        gen = ReasoningGymCurriculum({"tasks": ["chain_sum", "leg_counting"],
                                      "rows_per_round": 7})
        ctx = RoundContext("ds", 1, 0, Trigger(step=1), partition=partition, partitions=2)
        gen.rows = gen.generate(make_seed_dataset(), ctx).to_list()  # type: ignore[attr-defined]
        return gen

    first, second = share(0), share(1)
    assert len(first.rows) + len(second.rows) == 7  # type: ignore[attr-defined]
    assert first.stats["rows"] == {"chain_sum": {"0": 2}, "leg_counting": {"0": 2}}
    assert second.stats["rows"] == {"chain_sum": {"0": 2}, "leg_counting": {"0": 1}}
    questions = [r["prompt"][0]["content"] for g in (first, second) for r in g.rows]
    assert len(set(questions)) == len(questions)
    assert first.state == second.state
