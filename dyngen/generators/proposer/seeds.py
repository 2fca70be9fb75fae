"""Seeds: the `hard_k` hardest tasks the model writes variations of, chosen deterministically.

  - from the trigger's rollouts (`context.read_rollouts()`: JSONL of {"prompt": messages
    or str, "score": float, "ground_truth"?}): rollouts of one prompt are averaged, lowest
    mean first, ties to the earlier line; `seed_index` = its first line (0-based);
  - else from the newest `seed_window` rows of the dataset: lowest `extra_info.score`
    first, then unscored rows, newest first; `seed_index` = the row's position.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import datasets

from dyngen.generators.proposer.text import normalise, question_of
from dyngen.rollout_format import Rollout

if TYPE_CHECKING:
    from dyngen.round.context import RoundContext


@dataclass(frozen=True)
class Seed:
    """One hard task the model writes variations of."""

    index: int
    question: str
    score: float | None
    truth: str | None = None  # the seed's ground truth, when known
    system: tuple[dict[str, str], ...] = ()  # the seed's system messages, kept for new rows


def _text_or_none(value: Any) -> str | None:
    return None if value is None else str(value).strip()


def _system_of(prompt: Any) -> tuple[dict[str, str], ...]:
    if isinstance(prompt, str):
        return ()
    return tuple({"role": "system", "content": str(m["content"])} for m in prompt or ()
                 if isinstance(m, dict) and m.get("role") == "system" and m.get("content"))


def seeds_from_rollouts(rollouts: Sequence[Rollout], k: int) -> list[Seed]:
    """The `k` prompts with the lowest mean score among a batch's rollouts.

    Read them with `context.read_rollouts()`: the file is confined, bounded and checked.
    """
    if isinstance(rollouts, (str, os.PathLike)):
        raise TypeError("seeds_from_rollouts takes parsed rollouts, not a path: pass "
                        "context.read_rollouts() (or RolloutsPolicy(dirs).read(path)).")
    groups: dict[str, dict[str, Any]] = {}
    for r in rollouts:
        question = question_of(r.prompt)
        if question:
            g = groups.setdefault(normalise(question), {
                "line": r.line - 1, "q": question, "prompt": r.prompt, "s": [],
                "truth": r.ground_truth})
            g["s"].append(r.score)
    ranked = sorted(groups.values(), key=lambda g: (sum(g["s"]) / len(g["s"]), g["line"]))
    return [Seed(g["line"], g["q"], sum(g["s"]) / len(g["s"]), _text_or_none(g["truth"]),
                 _system_of(g["prompt"])) for g in ranked[:k]]


def seeds_from_dataset(rows: datasets.Dataset, k: int, window: int,
                       prompt_key: str = "prompt") -> list[Seed]:
    """Among the newest `window` rows: lowest extra_info.score first, then newest first."""
    start = max(0, len(rows) - window)
    recent = rows.select(range(start, len(rows)))
    extras = recent["extra_info"] if "extra_info" in recent.column_names else [None] * len(recent)
    order = []
    for i, extra in enumerate(extras):
        score = (extra or {}).get("score") if isinstance(extra, dict) else None
        score = float(score) if isinstance(score, (int, float)) else None
        order.append((score is None, score or 0.0, -i, i, score))
    out = []
    for *_, i, score in sorted(order):
        row = recent[i]
        question = question_of(row[prompt_key])
        if question:
            truth = _text_or_none((row.get("reward_model") or {}).get("ground_truth"))
            out.append(Seed(start + i, question, score, truth, _system_of(row[prompt_key])))
        if len(out) == k:
            break
    return out


def round_seeds(cfg: Mapping[str, Any], rows: datasets.Dataset,
                context: RoundContext | None) -> list[Seed]:
    """This round's seeds (`hard_k`, from the trigger's rollouts, else the newest
    `seed_window` rows); in a round of P partitions, this partition's every P-th."""
    rollouts = context.read_rollouts() if context is not None else []
    k = int(cfg["hard_k"])
    seeds = (seeds_from_rollouts(rollouts, k) if rollouts
             else seeds_from_dataset(rows, k, int(cfg["seed_window"])))
    if context is not None and context.partitions > 1:
        seeds = seeds[context.partition::context.partitions]
    return seeds


def min_rows_share(cfg: Mapping[str, Any], context: RoundContext | None) -> int:
    """The rows this partition keeps before it stops sampling: `min_rows` (default
    `hard_k`) over the round's partitions, rounded up."""
    min_rows = int(cfg["min_rows"] if cfg["min_rows"] is not None else cfg["hard_k"])
    shares = context.partitions if context is not None else 1
    return -(-min_rows // shares)
