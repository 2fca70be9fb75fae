"""Arithmetic word problems the proposer tests use: hard seeds, easy ones, rollouts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import datasets

from dyngen.generators.proposer import PROVENANCE_FEATURES

# Eight hard arithmetic word problems (the lowest scores of the batch) and their answers.
HARD = [
    ("Tom has 12 apples. He buys 7 more apples. How many apples does Tom have now?", "19"),
    ("A box holds 24 pencils. How many pencils are in 6 boxes?", "144"),
    ("Sara had 45 stickers and gave 18 to her friend. How many stickers does she have left?",
     "27"),
    ("A baker made 96 cookies and packed them equally into 8 bags. How many cookies are in "
     "each bag?", "12"),
    ("There are 15 rows of chairs with 12 chairs in each row. How many chairs are there?",
     "180"),
    ("Mike reads 23 pages on Monday and 38 pages on Tuesday. How many pages did he read?", "61"),
    ("A train travels 60 miles per hour for 4 hours. How far does it travel?", "240"),
    ("Lisa has 100 dollars. She spends 37 dollars on a book. How much money is left?", "63"),
]
EASY = [("What is 2 + 2?", "4"), ("What is 3 + 5?", "8")]


def task_row(i: int, question: str, truth: str, **extra: Any) -> dict[str, Any]:
    return {"data_source": "gsm8k-mini", "prompt": [{"role": "user", "content": question}],
            "ability": "math", "reward_model": {"style": "rule", "ground_truth": truth},
            "extra_info": {"index": i, "score": None, **extra}}


def task_dataset(provenance: bool = True) -> datasets.Dataset:
    """Version-0-style rows; with `provenance`, extra_info declares the proposer's fields."""
    declared = PROVENANCE_FEATURES if provenance else {}
    rows = [task_row(i, q, a, **dict.fromkeys(declared)) for i, (q, a) in enumerate(EASY + HARD)]
    features = datasets.Dataset.from_list(rows[:1]).features
    features["extra_info"] = {"index": datasets.Value("int64"),
                              "score": datasets.Value("float64"), **declared}
    return datasets.Dataset.from_list(rows, features=features)


def write_rollouts(path: Path) -> Path:
    """A batch's rollouts: each hard task twice with low scores, the easy ones high."""
    lines = []
    for q, a in EASY:
        lines.append({"prompt": [{"role": "user", "content": q}], "score": 1.0, "ground_truth": a})
    for rep in range(2):
        for i, (q, a) in enumerate(HARD):
            lines.append({"prompt": [{"role": "user", "content": q}], "score": 0.1 * rep + i / 100,
                          "ground_truth": a})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path
