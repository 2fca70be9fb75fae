"""The code tasks' reward inside real verl 0.9.1: loaded by verl's own `get_custom_reward_fn`
from `reward.custom_reward_function`, and called by verl's NaiveRewardManager on a batch of
seed-task rows that verl's RLHFDataset read from parquet, with tokenized responses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from verl import DataProto

from dyngen.generators.code_tasks.seed_tasks import SEED_FILE
from dyngen.generators.code_tasks.tasks import ABDUCTION, abduction_prompt
from tests.verl.batches import reward_manager, rollout_batch

PROGRAM = "def f(x):\n    return sorted(x)[-2:]"


def rows() -> list[dict[str, Any]]:
    """Three seed tasks, the third turned into an abduction task."""
    out = [json.loads(line) for line in SEED_FILE.read_text().splitlines()[:3]]
    out[2]["prompt"][-1]["content"] = abduction_prompt(PROGRAM, "f", "[4, 9]")
    out[2]["reward_model"]["ground_truth"] = "[4, 9]"
    out[2]["extra_info"].update(task=ABDUCTION, program=PROGRAM, input="[4, 1, 9]",
                                output="[4, 9]")
    return out


def batch(tmp_path: Path, tokenizer: Any, responses: list[str]) -> DataProto:
    """A rollout batch as verl's trainer holds it when it computes rewards."""
    return rollout_batch(tmp_path, tokenizer, rows(), responses, width=16)


def test_verl_loads_and_calls_the_reward_as_its_trainer_does(tmp_path: Path,
                                                             qwen_tokenizer: Any) -> None:
    manager = reward_manager(qwen_tokenizer, "pkg://dyngen.generators.code_tasks.reward")
    truths = [r["reward_model"]["ground_truth"] for r in rows()]
    # Right: the labels written differently ([9,7,4] for [9, 7, 4]) and another input the
    # program maps to [4, 9]; wrong: each off by a little.
    right = [f"Answer: {truths[0].replace(' ', '')}", f"Answer: {truths[1]}",
             "Answer: [9, 0, 4]"]
    wrong = ["Answer: [9, 7]", "Answer: 'desserts'", "Answer: [4, 10]"]
    for responses, expected in ((right, 1.0), (wrong, 0.0)):
        result = manager(batch(tmp_path, qwen_tokenizer, responses), return_dict=True)
        rewards = result["reward_tensor"].sum(-1).tolist()
        assert rewards == [expected] * 3, (responses, rewards)
