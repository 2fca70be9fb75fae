"""Exact match of the final number: the reward for dyngen's arithmetic generators' rows.

A completion scores 1.0 when the last number it writes (after its last `Answer:` if it has
one) equals the ground truth exactly, as a number (`42`, `42.0` and `1,042` read as
numbers); a non-numeric ground truth must equal the completion's final answer as text.
Anything else scores 0.0.

verl: reward.custom_reward_function.path=pkg://dyngen.generators.exact_match
      reward.custom_reward_function.name=compute_score
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?")
_ANSWER = re.compile(r"answer\s*[:=]", re.I)


def as_fraction(text: str) -> Fraction | None:
    """`text` as an exact number (commas as thousands separators), or None."""
    cleaned = text.strip().replace(",", "")
    try:
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


def final_answer(text: str) -> str:
    """What follows the completion's last `Answer:` (its whole text without one), stripped."""
    found = list(_ANSWER.finditer(text))
    return (text[found[-1].end():] if found else text).strip()


def compute_score(data_source: str, solution_str: str, ground_truth: Any,
                  extra_info: Mapping[str, Any] | None = None, **kwargs: Any) -> float:
    """1.0 if the completion's final number (or answer) is the ground truth, else 0.0."""
    answer = final_answer(solution_str or "")
    truth = as_fraction(str(ground_truth))
    if truth is None:
        return 1.0 if answer.rstrip(".").strip() == str(ground_truth).strip() else 0.0
    numbers = _NUMBER.findall(answer)
    if not numbers:
        return 0.0
    return 1.0 if as_fraction(numbers[-1]) == truth else 0.0
