"""The reasoning-gym reward inside real verl 0.9.1: loaded by verl's own `get_custom_reward_fn`
from `reward.custom_reward_function`, and called by verl's NaiveRewardManager on a batch of
curriculum rows that verl's RLHFDataset read from parquet, with tokenized responses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from verl import DataProto

from dyngen.generators.reasoning_gym import ReasoningGymCurriculum
from dyngen.round.context import RoundContext, Trigger
from tests.verl.batches import reward_manager, rollout_batch


def rows() -> list[dict[str, Any]]:
    """Three rows the curriculum wrote: chain_sum, leg_counting, basic_arithmetic."""
    gen = ReasoningGymCurriculum({"tasks": ["chain_sum", "leg_counting", "basic_arithmetic"],
                                  "rows_per_round": 3})
    return gen.generate([], RoundContext("verl", 1, 0, Trigger())).to_list()


def batch(tmp_path: Path, tokenizer: Any, made: list[dict[str, Any]],
          responses: list[str]) -> DataProto:
    """A rollout batch as verl's trainer holds it when it computes rewards."""
    return rollout_batch(tmp_path, tokenizer, made, responses, width=24)


def test_verl_loads_and_calls_the_reward_as_its_trainer_does(tmp_path: Path,
                                                             qwen_tokenizer: Any) -> None:
    manager = reward_manager(qwen_tokenizer, "pkg://dyngen.generators.reasoning_gym.reward")
    made = rows()
    truths = [r["reward_model"]["ground_truth"] for r in made]
    # Right: in answer tags, or as the last line; wrong: each off by one.
    right = [f"<answer>{truths[0]}</answer>", f"Counted.\n{truths[1]}",
             f"<answer> {truths[2]} </answer>"]
    wrong = [f"<answer>{int(t) + 1}</answer>" for t in truths]
    for responses, expected in ((right, 1.0), (wrong, 0.0)):
        result = manager(batch(tmp_path, qwen_tokenizer, made, responses), return_dict=True)
        rewards = result["reward_tensor"].sum(-1).tolist()
        assert rewards == [expected] * 3, (responses, rewards)
