"""A verifiable arithmetic curriculum: harder tasks after good batches, easier after bad.

Difficulty (number of digits) is read back from the dataset itself — the `digits` of
the rows this generator added last — so it survives trainer and server restarts.
"""

from __future__ import annotations

import random
from typing import Any

import datasets
import pyarrow.compute as pc

from generators.base import AbstractDataGenerator, rows_of

SOURCE = "dyngen-arithmetic"


def arithmetic_task(rng: random.Random, index: int, digits: int,
                    source: str = SOURCE) -> dict[str, Any]:
    """One addition or multiplication task with an exact ground truth, in verl's schema."""
    a = rng.randrange(10 ** (digits - 1), 10**digits)
    b = rng.randrange(1, 10**digits)
    op = rng.choice("+*")
    answer = a + b if op == "+" else a * b
    return {
        "data_source": source,
        "prompt": [
            {"role": "system", "content": "Answer with the final number only."},
            {"role": "user", "content": f"What is {a} {op} {b}?"},
        ],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(answer)},
        "extra_info": {"index": index, "digits": digits},
    }


class ArithmeticCurriculum(AbstractDataGenerator):
    """`tasks_per_round` new tasks; digits +1 above `target_score`, -1 below it.

    Config (data.datagen): tasks_per_round (8), target_score (0.6), score_metric
    ("score"), min_digits (1), max_digits (9), seed (0).
    """

    def generate(self, dataset: Any, context: Any = None) -> datasets.Dataset:
        """New tasks at the difficulty the last batch's score calls for."""
        cfg = self.config or {}
        rows = rows_of(dataset)
        current = self.current_digits(rows, int(cfg.get("min_digits", 1)))
        score = None
        if context is not None:
            score = context.trigger.metrics.get(str(cfg.get("score_metric", "score")))
        digits = current
        if score is not None:
            digits += 1 if score > float(cfg.get("target_score", 0.6)) else -1
        digits = max(int(cfg.get("min_digits", 1)), min(int(cfg.get("max_digits", 9)), digits))
        round_no = context.round if context is not None else len(rows)
        rng = random.Random(f"{cfg.get('seed', 0)}-{round_no}")
        n = int(cfg.get("tasks_per_round", 8))
        start = len(rows)
        return datasets.Dataset.from_list(
            [arithmetic_task(rng, start + i, digits) for i in range(n)])

    @staticmethod
    def current_digits(rows: datasets.Dataset, default: int) -> int:
        """Digits of the newest rows this generator wrote, else `default`."""
        if "data_source" not in rows.column_names or "extra_info" not in rows.column_names:
            return default
        # Arrow compute over the memory-mapped column: no Python loop over old rows.
        mine = pc.indices_nonzero(pc.equal(rows.data.column("data_source"), SOURCE))
        if len(mine) == 0:
            return default
        digits = (rows[int(mine[-1].as_py())]["extra_info"] or {}).get("digits")
        return int(digits) if digits else default
