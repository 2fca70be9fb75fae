"""The code tasks' reward: the final answer read and compared by value; abduction answers run
in the sandbox; called as verl's reward managers call it, and by a real TRL GRPOTrainer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import datasets
import pytest

from dyngen.errors import ConfigError
from dyngen.generators.code_tasks.reward import code_task_reward, compute_score, final_answer
from dyngen.generators.code_tasks.seed_tasks import SEED_FILE
from dyngen.generators.code_tasks.tasks import ABDUCTION, abduction_prompt

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".dyngen" / "models"
PROGRAM = "def f(x):\n    return sorted(x)[-2:]"
ABDUCTION_INFO = {"task": ABDUCTION, "program": PROGRAM, "function": "f", "input": "[4, 1, 9]",
                  "output": "[4, 9]"}


@pytest.mark.parametrize(("text", "answer"), [
    ("f sorts, so...\nAnswer: [1,2]", "[1,2]"),
    ("Answer: `'abc'`.", "'abc'"),
    ("**Answer:** 42.", "42."),
    ("answer: 3\nWait, no. Final answer: 4", "4"),
    ("The value is \\boxed{(1, 2)}", "(1, 2)"),
    ("It returns [1, 2].", None),
])
def test_the_final_answer_follows_the_last_answer_label(text: str, answer: str | None) -> None:
    assert final_answer(text) == answer


def verl_call(solution: str, ground_truth: str, extra_info: dict[str, Any] | None = None
              ) -> float:
    """As verl 0.9.1's NaiveRewardManager calls a custom reward function: keywords, and
    extra_info with the manager's own fields added."""
    info = {**(extra_info or {}), "num_turns": None, "rollout_reward_scores": {}}
    return compute_score(data_source="dyngen-code-tasks", solution_str=solution,
                         ground_truth=ground_truth, extra_info=info)


@pytest.mark.parametrize(("solution", "reward"), [
    ("Answer: [1,2]", 1.0), ("Answer: [1, 2]", 1.0), ("Answer: (1, 2)", 0.0),
    ("Answer: [2, 1]", 0.0), ("Answer: one, two", 0.0), ("no answer", 0.0), ("", 0.0),
])
def test_deduction_answers_are_compared_with_the_label_by_value(solution: str,
                                                                reward: float) -> None:
    assert verl_call(solution, "[1, 2]", {"task": "deduction"}) == reward
    assert verl_call(solution, "[1, 2]") == reward  # rows without a task field: deduction


@pytest.mark.parametrize(("solution", "reward"), [
    ("Answer: [4, 1, 9]", 1.0),  # the task's own input
    ("Answer: [9, 0, 4, 2]", 1.0),  # another input the program maps to [4, 9]: run to see
    ("Answer: [9, 4]", 1.0), ("Answer: [4, 9, 10]", 0.0), ("Answer: 7", 0.0),
    ("Answer: __import__('os')", 0.0),
])
def test_abduction_answers_are_checked_by_running_the_program(solution: str,
                                                              reward: float) -> None:
    assert verl_call(solution, "[4, 9]", ABDUCTION_INFO) == reward


def test_an_abduction_row_without_its_program_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="must hold its program and function"):
        verl_call("Answer: 3", "[4, 9]", {"task": ABDUCTION})


def test_trl_reads_text_completions_and_either_label_column() -> None:
    completions = ["f sorts it.\nAnswer: [1,2]", "Answer: [2, 1]"]
    labels = [{"style": "rule", "ground_truth": "[1, 2]"}] * 2
    assert code_task_reward(["p", "p"], completions, reward_model=labels) == [1.0, 0.0]
    assert code_task_reward(["p", "p"], completions, ground_truth=["[1, 2]"] * 2,
                            trainer_state=None) == [1.0, 0.0]


def test_trl_without_a_label_column_says_what_it_expected() -> None:
    with pytest.raises(ConfigError, match="reward_model column .* found \\['extra_info'"):
        code_task_reward(["p"], ["Answer: 1"], extra_info=[{}])


def test_a_real_grpo_trainer_passes_what_the_reward_reads(tmp_path: Path) -> None:
    """One GRPO step on the shipped seed tasks: TRL hands the rows' columns to the reward as
    keyword arguments. The completions of a 135M model after 8 tokens score 0; the same
    arguments with right answers (and an abduction row's other input) score 1."""
    from tests.integrations.test_trl import reward_calls_of_one_grpo_step

    rows = datasets.Dataset.from_json(str(SEED_FILE)).select(range(2)).to_list()
    rows[1]["prompt"][-1]["content"] = abduction_prompt(PROGRAM, "f", "[4, 9]")
    rows[1]["reward_model"]["ground_truth"] = "[4, 9]"
    rows[1]["extra_info"] = {**rows[1]["extra_info"], **ABDUCTION_INFO}

    def right(kwargs: dict[str, Any]) -> list[Any]:
        return [[{"role": "assistant", "content": "So: Answer: " + (
            "[9, 0, 4]" if info["task"] == ABDUCTION else model["ground_truth"])}]
            for model, info in zip(kwargs["reward_model"], kwargs["extra_info"], strict=True)]

    calls = reward_calls_of_one_grpo_step(rows, code_task_reward, right, tmp_path / "out",
                                          CACHE)
    for call in calls:
        assert {"reward_model", "extra_info", "ability", "data_source"} <= set(call["kwargs"])
        assert isinstance(call["completions"][0], list)  # conversational: messages
        assert call["scores"] == [0.0] * len(call["scores"])
        assert call["right"] == [1.0] * len(call["right"])
