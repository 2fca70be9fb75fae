"""A complete, runnable dyngen generator: rephrase the tasks the model found hardest.

Run one round with it (after `dyngen import my-data train.parquet`):

    dyngen round my-data data.datagen.path=examples/paraphrase_generator.py \
        data.datagen.name=ParaphraseHardest +data.datagen.k=4 --step 1

A generator subclasses AbstractDataGenerator, is built with the `data.datagen` config
subtree, and returns only the NEW rows in verl's schema. The round filters them (schema,
over-long prompts, duplicates) and commits them as a new version with lineage.
"""

from __future__ import annotations

from typing import Any

import datasets

from dyngen import AbstractDataGenerator, RoundContext

TEMPLATES = ["Please solve: {q}", "{q} Think step by step.", "Here is a problem. {q}"]


class ParaphraseHardest(AbstractDataGenerator):
    """New wordings of the `k` newest tasks, one template further each round."""

    defaults = {"k": 4}  # data.datagen keys: settings() refuses others, and a non-integer k

    def generate(self, dataset: Any, context: RoundContext | None = None) -> datasets.Dataset:
        rows = getattr(dataset, "dataframe", dataset)  # verl passes a wrapper
        k = self.settings()["k"]
        # the round's memory: which template comes next (kept in the dataset's lineage)
        previous = (context.previous_state if context is not None else None) or {}
        template = TEMPLATES[int(previous.get("template", -1) + 1) % len(TEMPLATES)]
        self.state = {"template": TEMPLATES.index(template)}
        new = []
        for i in range(max(0, len(rows) - k), len(rows)):
            row = rows[i]
            question = row["prompt"][-1]["content"]
            new.append({
                "data_source": "paraphrase",
                "prompt": [*row["prompt"][:-1],
                           {"role": "user", "content": template.format(q=question)}],
                "ability": row["ability"],
                "reward_model": row["reward_model"],  # same question, same answer
                "extra_info": {**(row["extra_info"] or {}), "index": len(rows) + len(new)},
            })
        return datasets.Dataset.from_list(new)
