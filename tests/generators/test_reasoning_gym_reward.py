"""The reasoning-gym reward: the final answer read as reasoning-gym reads it, the family's
scorer on the stored entry; called as verl's reward managers call it, and by a real TRL
GRPOTrainer on rows the curriculum wrote."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dyngen.errors import ConfigError
from dyngen.generators.reasoning_gym import ReasoningGymCurriculum
from dyngen.generators.reasoning_gym.reward import compute_score, final_answer, reasoning_gym_reward
from dyngen.round.context import RoundContext, Trigger
from tests.generators.contract import make_seed_dataset

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".dyngen" / "models"


def rows(tasks: list[str], n: int) -> list[dict[str, Any]]:
    gen = ReasoningGymCurriculum({"tasks": tasks, "rows_per_round": n})
    return gen.generate(make_seed_dataset(1), RoundContext("r", 1, 0, Trigger())).to_list()


@pytest.mark.parametrize(("text", "answer"), [
    ("Let me think.\n<answer> 42 </answer>", "42"),
    ("<answer>1</answer> then <answer>\n2\n</answer>", "2"),
    ("<answer>a\nb</answer>\nDone.", "a\nb"),
    ("So the sum is\n\n 17 \n", "17"),
    ("", None), ("\n  \n", None),
])
def test_the_final_answer_is_the_last_answer_tag_else_the_last_line(text: str,
                                                                   answer: str | None) -> None:
    assert final_answer(text) == answer


def verl_call(row: dict[str, Any], solution: str) -> float:
    """As verl 0.9.1's NaiveRewardManager calls a custom reward function: keywords, and
    extra_info with the manager's own fields added."""
    info = {**row["extra_info"], "num_turns": None, "rollout_reward_scores": {}}
    return compute_score(data_source=row["data_source"], solution_str=solution,
                         ground_truth=row["reward_model"]["ground_truth"], extra_info=info)


def test_verl_form_scores_with_the_familys_scorer() -> None:
    row = rows(["chain_sum"], 1)[0]
    truth = row["reward_model"]["ground_truth"]
    assert verl_call(row, f"I add them up.\n<answer>{truth}</answer>") == 1.0
    assert verl_call(row, f"I add them up.\n{truth}") == 1.0
    assert verl_call(row, f"<answer>{int(truth) + 1}</answer>") == 0.0
    assert verl_call(row, "") == 0.0


def test_a_scorer_that_raises_on_a_malformed_answer_scores_zero() -> None:
    # prime_factorization's scorer calls int() on each factor of the answer.
    row = rows(["prime_factorization"], 1)[0]
    assert verl_call(row, "<answer>two times three</answer>") == 0.0
    assert verl_call(row, f"<answer>{row['reward_model']['ground_truth']}</answer>") == 1.0


def test_rows_that_are_not_reasoning_gym_rows_are_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="expected extra_info.reasoning_gym .* found "
                                          "extra_info keys \\['index'\\]"):
        compute_score("openai/gsm8k", "<answer>4</answer>", "4", {"index": 0})
    with pytest.raises(ConfigError, match="expected the dataset's extra_info column"):
        reasoning_gym_reward(["p"], ["4"], ground_truth=["4"])


def test_trl_form_reads_text_and_conversational_completions() -> None:
    made = rows(["chain_sum", "leg_counting"], 2)
    truths = [r["reward_model"]["ground_truth"] for r in made]
    completions = [f"<answer>{truths[0]}</answer>",
                   [{"role": "assistant", "content": f"Counting.\n{truths[1]}"}]]
    kwargs = {"extra_info": [r["extra_info"] for r in made],
              "data_source": [r["data_source"] for r in made], "trainer_state": None}
    assert reasoning_gym_reward(["p", "p"], completions, **kwargs) == [1.0, 1.0]
    assert reasoning_gym_reward(["p", "p"], ["no", [{"role": "assistant", "content": ""}]],
                                **kwargs) == [0.0, 0.0]


def test_a_real_grpo_trainer_passes_what_the_reward_reads(tmp_path: Path) -> None:
    """One GRPO step on two curriculum rows: TRL hands the rows' columns to the reward as
    keyword arguments. A 135M model's completions after 8 tokens score below 1; the same
    arguments with the labels as answers score 1."""
    from tests.integrations.test_trl import reward_calls_of_one_grpo_step

    def right(kwargs: dict[str, Any]) -> list[Any]:
        return [[{"role": "assistant", "content": f"<answer>{m['ground_truth']}</answer>"}]
                for m in kwargs["reward_model"]]

    calls = reward_calls_of_one_grpo_step(rows(["chain_sum", "basic_arithmetic"], 2),
                                          reasoning_gym_reward, right, tmp_path / "out", CACHE)
    for call in calls:
        assert {"reward_model", "extra_info", "data_source"} <= set(call["kwargs"])
        assert isinstance(call["completions"][0], list)  # conversational: messages
        assert all(0.0 <= s < 1.0 for s in call["scores"]), call["completions"]
        assert call["right"] == [1.0] * len(call["right"])
