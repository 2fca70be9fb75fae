"""How much of a training batch can teach the policy: the spread of each prompt's rewards.

In GRPO-style training a prompt's advantage is its samples' rewards minus their mean: a
prompt whose samples all score the same (all right, all wrong) gives no gradient. A
trainer's batch end carries two numbers about it, under names every trainer shares:

- `dyngen/zero_spread_share`: the share of the batch's prompts (with at least two scored
  samples) whose rewards are all equal. TRL's GRPOTrainer logs it as `frac_reward_zero_std`;
  1 − it is the *effective-prompt share*.
- `dyngen/reward_spread`: the mean over those prompts of the standard deviation of their
  rewards (n − 1 in the denominator, as TRL's GRPO scales advantages).

`DyngenCallback` (TRL) and `dyngen follow` (verl) put them in each batch end's metrics, so
they reach the round's lineage (`trigger.metrics`) and `dyngen report`.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping
from typing import Any

from dyngen.store.inbox_input import check_metrics

ZERO_SPREAD_SHARE = "dyngen/zero_spread_share"
REWARD_SPREAD = "dyngen/reward_spread"
# Two rewards this close are the same reward: TRL compares a group's std to 0 with
# torch.isclose, whose default absolute tolerance is 1e-8.
SAME = 1e-8


def finite(value: Any) -> bool:
    """Whether the store keeps `value` as a metric (its own check, `check_metrics`): a real
    number, numpy's included but not a bool, finite as a float. Never raises."""
    try:
        check_metrics({"value": value})
    except Exception:  # BatchEndError, or a number whose float() fails its own way
        return False
    return True


def prompt_key(prompt: Any) -> str:
    """One key per prompt, whatever form it has (chat messages or text)."""
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, default=str)


def grouped(samples: Iterable[tuple[Any, Any]]) -> dict[str, list[float]]:
    """(prompt, reward) pairs as each prompt's finite rewards, in first-seen order."""
    out: dict[str, list[float]] = {}
    for prompt, reward in samples:
        scores = out.setdefault(prompt_key(prompt), [])
        if finite(reward):
            scores.append(float(reward))
    return out


def spread_metrics(groups: Mapping[str, list[float]], *, zero_spread_extra: int = 0,
                   spread_extra: int = 0) -> dict[str, float]:
    """The two metrics over each prompt's rewards; {} when no prompt has two rewards.

    `zero_spread_extra` / `spread_extra` count prompts that were sampled but are not in
    `groups`, known to have had no spread / some spread (verl's DAPO filter evicts the
    first and discards a surplus of the second before it dumps the batch).
    """
    scored = [g for g in groups.values() if len(g) >= 2]
    total = len(scored) + zero_spread_extra + spread_extra
    if not total:
        return {}
    zero = sum(1 for g in scored if max(g) - min(g) <= SAME) + zero_spread_extra
    out = {ZERO_SPREAD_SHARE: zero / total}
    if scored:
        out[REWARD_SPREAD] = statistics.fmean(statistics.stdev(g) for g in scored)
    return out
