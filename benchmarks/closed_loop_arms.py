"""The closed loop's other arms and the table that compares every arm (closed_loop.py).

- `ScreenedPool`, the **dynamic-sampling** arm's data (DAPO-style; TRL's GRPOTrainer has none,
  TRL #3708): the static pool, but each prompt is first sampled `generations` times by the
  trainer's live policy and passed on only if its group's rewards differ; a prompt whose
  group is all right or all wrong is dropped and the next one tried, up to `screen_cap`
  candidates per slot (then the last one goes through). Every screening completion is
  counted as an extra rollout. DAPO itself trains on the screening group; here the trainer
  samples the passed prompt again, so its own group can still come back without spread.
- `summary`: per arm, the effective share, the share of steps at or above 0.8 after the
  first round, rollouts per effective prompt (training, screening, and the rounds' grading
  off the training path), staleness, retired rows, seconds per step and held-out accuracy.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from typing import Any

import datasets
from datasets.iterable_dataset import ExamplesIterable

GOAL_SHARE = 0.8


class ScreenedPool(datasets.IterableDataset):
    """The static pool, each prompt passed on only if the live policy's group is mixed."""

    def __init__(self, pool: list[dict[str, Any]], generations: int, max_tokens: int,
                 screen_cap: int, seed: int) -> None:
        self.pool, self.generations, self.max_tokens = pool, generations, max_tokens
        self.screen_cap, self.seed = screen_cap, seed
        self.model: Any = None  # the trainer's model, set once the trainer exists
        self.tokenizer: Any = None
        self.screened: list[dict[str, int]] = []  # per prompt passed on: candidates, rollouts
        super().__init__(ExamplesIterable(self._rows, {}))

    def shuffle(self, seed: int | None = None, generator: Any = None,
                buffer_size: int = 1000) -> ScreenedPool:
        return self  # shuffled already, by its seed

    def _rows(self) -> Iterator[tuple[str, dict[str, Any]]]:
        import random

        order = list(range(len(self.pool)))
        random.Random(self.seed).shuffle(order)
        at = 0
        while True:
            tried = 0
            while True:
                row = self.pool[order[at % len(order)]]
                at += 1
                tried += 1
                if self._mixed(row) or tried >= self.screen_cap:
                    break
            self.screened.append({"candidates": tried, "rollouts": tried * self.generations})
            yield str(at), row

    def _mixed(self, row: dict[str, Any]) -> bool:
        """Whether `generations` samples of the live policy get different rewards."""
        import torch

        from dyngen.generators.exact_match import compute_score

        ids = self.tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True,
                                                 return_tensors="pt", return_dict=True)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                out = self.model.generate(**ids, do_sample=True, temperature=1.0, top_p=1.0,
                                          top_k=0, max_new_tokens=self.max_tokens,
                                          num_return_sequences=self.generations,
                                          pad_token_id=self.tokenizer.eos_token_id)
        finally:
            self.model.train(was_training)
        start = ids["input_ids"].shape[1]
        texts = self.tokenizer.batch_decode(out[:, start:], skip_special_tokens=True)
        truth = row["reward_model"]["ground_truth"]
        scores = {compute_score(row["data_source"], t, truth) for t in texts}
        return len(scores) > 1


def effective(step: dict[str, Any]) -> float:
    return 1.0 - step["zero_spread"]


def stale_gaps(arm: Any) -> list[int]:
    """Steps from each trained prompt's newest measurement to the step that trained it: the
    row's difficulty record where the sampler showed it, else its version's measuring
    checkpoint (prompts measured by nothing are left out)."""
    policy = {v["version"]: v["policy_step"] for v in arm.versions}
    gaps = []
    for step in arm.steps:
        last = step.get("last_measured") or []
        versions = step.get("versions") or []
        for i, version in enumerate(versions):
            seen = last[i] if i < len(last) and last[i] is not None else policy.get(version)
            if seen is not None:
                gaps.append(step["step"] - seen)
    return gaps


def summary(arms: list[Any], sizes: Any, first_round_step: int = 1) -> list[str]:
    """One row per arm; seconds per step as a ratio to the static arm's."""
    static = next((a for a in arms if a.name == "static"), None)
    base = statistics.fmean(s["step_time"] for s in static.steps) if static else None
    lines = ["| arm | effective share (mean) | steps >= 0.8 after the first round | rollouts "
             "per effective prompt: training + screening (+ rounds' grading, off the path) | "
             "staleness median (mean, max) | retired rows | step_time s (÷ static) | "
             "held-out accuracy |", "|" + "---|" * 8]
    for arm in arms:
        shares = [effective(s) for s in arm.steps]
        after = [x for s, x in zip(arm.steps, shares, strict=True)
                 if s["step"] >= first_round_step]
        good = sum(x >= GOAL_SHARE for x in after)
        eff_prompts = sum(x * sizes.prompts for x in shares)
        training = len(arm.steps) * sizes.prompts * sizes.generations
        screening = sum(s.get("extra_rollouts", 0) for s in arm.steps)
        grading = sum(int(v.get("samples_spent") or (v.get("graded") or 0) * sizes.generations)
                      for v in arm.versions)
        per = (training + screening) / eff_prompts if eff_prompts else float("inf")
        off = f" (+{grading / eff_prompts:.0f})" if grading and eff_prompts else ""
        gaps = stale_gaps(arm)
        stale = (f"{statistics.median(gaps):.0f} ({statistics.fmean(gaps):.1f}, {max(gaps)})"
                 if gaps else "-")
        secs = statistics.fmean(s["step_time"] for s in arm.steps)
        ratio = f" ({secs / base:.2f})" if base else ""
        lines.append(f"| {arm.name} | {statistics.fmean(shares):.3f} | {good} of {len(after)} "
                     f"| {per:.1f}{off} | {stale} | {arm.retired} | {secs:.1f}{ratio} | "
                     f"{arm.accuracy_end:.3f} |")
    return lines
