"""The reward for reasoning-gym rows, for verl and for TRL: the family's own scorer.

The answer is the completion's last `<answer>…</answer>` (stripped, as reasoning-gym's own
`extract_answer` reads it), else its last non-empty line. It is scored by the family's
scorer (`score_answer` of its dataset at the row's level: some scorers read their
configuration; `get_score_answer_fn(family)` for a row without a level) against the entry
stored in the row's `extra_info.reasoning_gym.entry`; a scorer that raises on a malformed
answer scores 0.0.
Scores are the scorer's: 1.0 right, partial credit where the family gives it.

verl (0.9.1): reward.custom_reward_function.path=pkg://dyngen.generators.reasoning_gym.reward
              reward.custom_reward_function.name=compute_score
TRL:          GRPOTrainer(reward_funcs=[reasoning_gym_reward], ...) on rows in verl's schema
              (their data_source and extra_info columns arrive as keyword arguments).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from dyngen.errors import ConfigError
from dyngen.generators.reasoning_gym.families import decode_entry, family_of_source, scorer
from dyngen.text import completion_text

_ANSWER = re.compile(r"<answer>\s?(.*?)\s?</answer>", re.DOTALL)


def final_answer(text: str) -> str | None:
    """The completion's last `<answer>` block, else its last non-empty line; None if empty."""
    found = _ANSWER.findall(text or "")
    if found:
        return found[-1].strip()
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else None


def entry_of(extra_info: Mapping[str, Any] | None, data_source: str | None = None
             ) -> tuple[str, int | None, dict[str, Any]]:
    """(family, level, entry) stored in a row's extra_info; a clear error if not there."""
    info = (extra_info or {}).get("reasoning_gym") if isinstance(extra_info, Mapping) else None
    if isinstance(info, str):  # a trainer that kept the struct as JSON text
        info = json.loads(info)
    entry = info.get("entry") if isinstance(info, Mapping) else None
    family = (info.get("family") if isinstance(info, Mapping) else None) \
        or family_of_source(data_source)
    if entry is None or not family:
        keys = sorted(extra_info) if isinstance(extra_info, Mapping) else []
        raise ConfigError(
            "reasoning-gym reward: expected extra_info.reasoning_gym = {family, level, entry} "
            f"(rows ReasoningGymCurriculum wrote); found extra_info keys {keys} and "
            f"data_source {data_source!r}. Train on those rows, or score other rows with "
            "their own reward function.")
    level = info.get("level")
    level = level if isinstance(level, int) and not isinstance(level, bool) else None
    return str(family), level, decode_entry(entry) if isinstance(entry, str) else dict(entry)


def score(solution: str, family: str, entry: dict[str, Any], level: int | None = None) -> float:
    """The family's scorer (its dataset's at `level`) on the completion's final answer;
    0.0 for no answer, or if the scorer raises."""
    answer = final_answer(solution)
    if answer is None:
        return 0.0
    try:
        value = scorer(family, level)(answer, entry)
    except Exception:  # noqa: BLE001 - a scorer may choke on any malformed answer
        return 0.0
    return float(value)


def compute_score(data_source: str, solution_str: str, ground_truth: Any = None,
                  extra_info: Mapping[str, Any] | None = None, **kwargs: Any) -> float:
    """verl's custom reward function: called with keywords by verl's reward managers.

    The label is the stored entry (the scorer reads its answer and metadata), so
    `ground_truth` is not needed; it is the entry's answer, for readers of the row.
    """
    family, level, entry = entry_of(extra_info, data_source)
    return score(solution_str or "", family, entry, level)


def reasoning_gym_reward(prompts: Sequence[Any], completions: Sequence[Any],
                         extra_info: Sequence[Mapping[str, Any] | None] | None = None,
                         data_source: Sequence[str] | None = None, **kwargs: Any) -> list[float]:
    """TRL's reward function: one score per completion, from the rows' own columns."""
    if extra_info is None:
        raise ConfigError(
            "reasoning_gym_reward: expected the dataset's extra_info column (verl's schema, as "
            f"ReasoningGymCurriculum writes it) among the keyword arguments; found "
            f"{sorted(kwargs)}. Train on rows ReasoningGymCurriculum wrote.")
    sources = list(data_source) if data_source is not None else [None] * len(completions)
    out = []
    for completion, info, source in zip(completions, extra_info, sources, strict=True):
        family, level, entry = entry_of(info, source)
        out.append(score(completion_text(completion), family, entry, level))
    return out
