"""A verifiable arithmetic curriculum: harder tasks after good batches, easier after bad.

Each task has an exact ground truth. Difficulty has three knobs — digits per operand,
the operations allowed, and the number of steps (operands) — stepped together as one
level. The level moves up when the batch's score is above a target and down when it is
below; it is remembered in the dataset's lineage (`self.state`, recorded by the round
and handed back as `context.previous_state`), not in process memory, so it survives
trainer and server restarts. Output is deterministic for a given seed and round.
"""

from __future__ import annotations

import random
from typing import Any

import datasets

from dyngen.generators.base import AbstractDataGenerator
from dyngen.round.context import RoundContext

SOURCE = "dyngen-arithmetic"
# level -> (digits per operand, operations, operands); level 1 is the easiest
LEVELS: dict[int, tuple[int, str, int]] = {
    1: (1, "+", 2), 2: (1, "+-", 2), 3: (2, "+-", 2), 4: (2, "+-*", 2), 5: (2, "+-*", 3),
    6: (3, "+-*", 3), 7: (3, "+-*", 4), 8: (4, "+-*", 4),
}


def evaluate(expression: str) -> int:
    """The value of `a op b op c …` with * before + and -, as the task states it."""
    tokens = expression.split()
    terms: list[int] = [int(tokens[0])]
    signs: list[str] = []
    for op, num in zip(tokens[1::2], tokens[2::2], strict=True):
        if op == "*":
            terms[-1] *= int(num)
        else:
            signs.append(op)
            terms.append(int(num))
    total = terms[0]
    for sign, term in zip(signs, terms[1:], strict=True):
        total = total + term if sign == "+" else total - term
    return total


def arithmetic_task(rng: random.Random, index: int, level: int,
                    source: str = SOURCE) -> dict[str, Any]:
    """One task of the given level, with its exact answer as ground truth, in verl's schema."""
    digits, ops, operands = LEVELS[level]
    numbers = [rng.randrange(10 ** (digits - 1) if digits > 1 else 1, 10**digits)
               for _ in range(operands)]
    expression = str(numbers[0])
    for n in numbers[1:]:
        expression += f" {rng.choice(ops)} {n}"
    return {
        "data_source": source,
        "prompt": [
            {"role": "system", "content": "Answer with the final number only."},
            {"role": "user", "content": f"What is {expression}?"},
        ],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(evaluate(expression))},
        "extra_info": {"index": index, "level": level},
    }


class ArithmeticCurriculum(AbstractDataGenerator):
    """`tasks_per_round` new tasks at a level that follows the last batch's score.

    Config (data.datagen): tasks_per_round (8), target_score (0.6), score_metric
    ("score"), start_level (1), seed (0). Without a score the level stays.
    """

    defaults = {"tasks_per_round": 8, "target_score": 0.6, "score_metric": "score",
                "start_level": 1, "seed": 0}

    def generate(self, dataset: Any, context: RoundContext | None = None) -> datasets.Dataset:
        """New tasks at the level the last batch's score calls for."""
        cfg = self.settings()
        previous = (context.previous_state if context is not None else None) or {}
        level = int(previous.get("level", cfg["start_level"]))
        score = None
        if context is not None:
            score = context.metrics.get(cfg["score_metric"])  # the newest batch end's
        if score is not None:
            level += 1 if score > cfg["target_score"] else -1
        level = max(1, min(max(LEVELS), level))
        self.state = {"level": level, "score": score}
        round_no = context.round_seed if context is not None else 0
        rng = random.Random(f"{cfg['seed']}-{round_no}")
        start = len(getattr(dataset, "dataframe", dataset))
        n = cfg["tasks_per_round"]
        return datasets.Dataset.from_list(
            [arithmetic_task(rng, start + i, level) for i in range(n)])
