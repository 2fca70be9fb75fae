"""For the reward tests: verl's reward manager, with a reward loaded as verl's trainer loads it,
and a rollout batch as the trainer holds it when it computes rewards."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import verl
from omegaconf import OmegaConf
from verl import DataProto
from verl.trainer.ppo.reward import get_custom_reward_fn
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn
from verl.workers.reward_manager.naive import NaiveRewardManager


def reward_manager(tokenizer: Any, path: str) -> NaiveRewardManager:
    """verl's NaiveRewardManager calling `path`'s compute_score, loaded by verl's own
    `get_custom_reward_fn` from `reward.custom_reward_function` of its trainer config."""
    base = OmegaConf.load(Path(verl.__file__).parent / "trainer/config/_generated_ppo_trainer.yaml")
    cfg = OmegaConf.merge(base, {"reward": {"custom_reward_function": {
        "path": path, "name": "compute_score"}}})
    return NaiveRewardManager(tokenizer, num_examine=0, compute_score=get_custom_reward_fn(cfg))


def rollout_batch(tmp_path: Path, tokenizer: Any, rows: list[dict[str, Any]],
                  responses: list[str], width: int) -> DataProto:
    """`rows` read by verl's RLHFDataset from parquet, each answered by `responses[i]` cut
    to `width` tokens, as the trainer's batch reaches its reward manager."""
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    data = OmegaConf.create({"max_prompt_length": 512, "filter_overlong_prompts": False,
                             "cache_dir": str(tmp_path / "cache")})
    ds = RLHFDataset([str(path)], tokenizer, data)
    collated = collate_fn([ds[i] for i in range(len(ds))])
    non_tensors = {k: v for k, v in collated.items() if isinstance(v, np.ndarray)}
    prompts = tokenizer(["question"] * len(responses), return_tensors="pt")["input_ids"]
    answers = [tokenizer(r, add_special_tokens=False)["input_ids"][:width] for r in responses]
    response_ids = torch.full((len(responses), width), tokenizer.pad_token_id)
    mask = torch.zeros((len(responses), prompts.shape[1] + width), dtype=torch.long)
    mask[:, :prompts.shape[1]] = 1
    for i, ids in enumerate(answers):
        response_ids[i, :len(ids)] = torch.tensor(ids)
        mask[i, prompts.shape[1]:prompts.shape[1] + len(ids)] = 1
    return DataProto.from_dict(
        tensors={"prompts": prompts, "responses": response_ids, "attention_mask": mask},
        non_tensors=non_tensors)
