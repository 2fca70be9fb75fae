"""reasoning_gym and code_inputs: each variant's label proved again here, independently of
the augmenter (the family's scorer; a fresh sandbox run), and rows they cannot serve skipped."""

from __future__ import annotations

import datasets
import pytest

from dyngen.generators.augment import CodeInputsAugmenter, ReasoningGymAugmenter
from dyngen.generators.code_tasks.seed_tasks import SEED_FILE
from dyngen.generators.code_tasks.tasks import literal
from dyngen.generators.reasoning_gym import ReasoningGymCurriculum
from dyngen.generators.reasoning_gym.reward import compute_score
from dyngen.sandbox import run_python, same_value


def _arithmetic_row() -> dict:
    return {"data_source": "sums", "ability": "math",
            "prompt": [{"role": "user", "content": "What is 2 + 2?"}],
            "reward_model": {"style": "rule", "ground_truth": "4"}, "extra_info": {"index": 9}}


def test_reasoning_gym_variants_keep_family_and_level_and_score_by_the_scorer() -> None:
    source = ReasoningGymCurriculum({"tasks": ["basic_arithmetic", "leg_counting"],
                                     "rows_per_round": 4}).generate(
        datasets.Dataset.from_dict({"prompt": []})).to_list()
    rows = [*source, {**_arithmetic_row(), "extra_info": {"index": 4, "reasoning_gym": None}}]
    gen = ReasoningGymAugmenter({"select": "random", "rows_per_round": 5})
    new = gen.generate(datasets.Dataset.from_list(rows)).to_list()
    assert len(new) == 4 and gen.stats["methods"]["reasoning_gym"]["skipped"] == {
        "not_reasoning_gym": 1}
    for row in new:
        src = rows[row["extra_info"]["augmented_from"]["index"]]
        assert row["data_source"] == src["data_source"]
        assert row["extra_info"]["reasoning_gym"]["level"] == \
            src["extra_info"]["reasoning_gym"]["level"]
        assert row["prompt"] != src["prompt"]
        truth = row["reward_model"]["ground_truth"]
        assert compute_score(row["data_source"], f"<answer>{truth}</answer>",
                             extra_info=row["extra_info"]) == 1.0


def test_code_input_variants_are_labelled_by_what_the_program_returns() -> None:
    seeds = datasets.load_dataset("json", data_files=str(SEED_FILE), split="train")
    rows = [*seeds.select(range(6)).to_list(), _arithmetic_row()]
    gen = CodeInputsAugmenter({"select": "random", "rows_per_round": 7})
    new = gen.generate(datasets.Dataset.from_list(rows)).to_list()
    assert len(new) >= 5 and gen.stats["methods"]["code_inputs"]["skipped"].get(
        "not_a_code_task") == 1
    for row in new:
        info = row["extra_info"]
        src = rows[info["augmented_from"]["index"]]["extra_info"]
        assert info["program"] == src["program"] and info["input"] != src["input"]
        assert f"f({info['input']})" in row["prompt"][-1]["content"]
        again = run_python(info["program"], info["function"], literal(info["input"])[1])
        assert again.ok and same_value(again.value, row["reward_model"]["ground_truth"])


@pytest.mark.parametrize("sandbox", ["docker"])
def test_an_unknown_sandbox_is_refused(sandbox: str) -> None:
    from dyngen.errors import ConfigError

    with pytest.raises(ConfigError, match="data.datagen.sandbox"):
        CodeInputsAugmenter({"sandbox": sandbox}).settings()


def _code_row(index: int, program: str, shown: str) -> dict:
    from dyngen.generators.code_tasks.tasks import deduction_prompt

    return {"data_source": "code", "ability": "code",
            "prompt": [{"role": "user", "content": deduction_prompt(program, "f", shown)}],
            "reward_model": {"style": "rule", "ground_truth": "unused"},
            "extra_info": {"index": index, "task": "deduction", "program": program,
                           "function": "f", "input": shown, "output": "unused"}}


def test_a_code_input_label_holds_under_every_hash_seed() -> None:
    """`list(set(xs))` of words: its order is the hash seed's, so two seeds (0 and 1) agreeing
    by chance once made a label most seeds contradict. Every label kept now holds under 20
    hash seeds, and the seed-dependent inputs are refused as nondeterministic."""
    words = '["apple", "banana", "cherry", "date", "elder", "fig"]'
    unordered = "def f(xs):\n    return list(set(xs))"
    ordered = "def f(xs):\n    return sorted(set(xs))"
    rows = [_code_row(i, unordered, words) for i in range(6)] + [_code_row(6, ordered, words)]
    # seed 3: with hash_seeds=2 (the old two runs) these draws keep a label seeds contradict
    gen = CodeInputsAugmenter({"select": "random", "rows_per_round": 7, "seed": 3})
    new = gen.generate(datasets.Dataset.from_list(rows)).to_list()
    assert gen.stats["failed_runs"].get("nondeterministic", 0) > 0, gen.stats
    assert any(r["extra_info"]["program"] == ordered for r in new)  # a sound label is kept
    for row in new:
        info = row["extra_info"]
        argument = literal(info["input"])[1]
        for seed in range(20):
            again = run_python(info["program"], "f", argument, hash_seed=seed)
            assert again.ok and same_value(again.value, row["reward_model"]["ground_truth"]), (
                info["program"], info["input"], seed)


def test_too_few_hash_seeds_are_refused() -> None:
    from dyngen.errors import ConfigError

    with pytest.raises(ConfigError, match="data.datagen.hash_seeds"):
        CodeInputsAugmenter({"hash_seeds": 1}).settings()
