"""A generator that asks a model (dyngen.llm): served, or in-process on a laptop.

For each of the `k` newest tasks the model writes a one-sentence study tip; the new task is
the tip as a system message before the task's own question, unchanged, so its ground truth
still holds. Point it at any OpenAI-compatible endpoint with the model keys of dyngen.llm:

    dyngen round my-data data.datagen.path=examples/model_hints_generator.py \
        data.datagen.name=ModelHints +data.datagen.endpoint=http://gpu-host:8000/v1 \
        +data.datagen.api_key_env=MY_LLM_KEY --step 1

A request the model fails (after its retries) drops that task's row, counted in the stats.
"""

from __future__ import annotations

from typing import Any

import datasets

from dyngen import AbstractDataGenerator
from dyngen.llm import MODEL_DEFAULTS, ChatRequest, chat_model, seed_int

ASK = "In one short sentence, give a student a tip for solving this problem:\n"


class ModelHints(AbstractDataGenerator):
    """The `k` newest tasks again, each led by a study tip the configured model wrote."""

    defaults = {**MODEL_DEFAULTS, "k": 4, "max_tokens": 32}  # endpoint, api_key_env, ...

    def generate(self, dataset: Any, context: Any = None) -> datasets.Dataset:
        cfg = self.settings()
        rows = getattr(dataset, "dataframe", dataset)
        picked = [rows[i] for i in range(max(0, len(rows) - cfg["k"]), len(rows))]
        with chat_model(cfg) as model:  # served if `endpoint` is set, else in-process
            model.check()  # an endpoint that cannot answer fails the round here
            results = model.complete([
                ChatRequest([{"role": "user", "content": ASK + row["prompt"][-1]["content"]}],
                            max_tokens=cfg["max_tokens"], temperature=0.7,
                            seed=seed_int("hint", i), stop=("\n",))
                for i, row in enumerate(picked)])
        new = []
        for row, result in zip(picked, results, strict=True):
            if not result.ok or not result.texts[0].strip():
                continue  # no tip: no row (self.stats counts it)
            new.append({
                "data_source": "model-hints",
                "prompt": [{"role": "system", "content": result.texts[0].strip()},
                           *row["prompt"]],
                "ability": row["ability"],
                "reward_model": row["reward_model"],  # the same question: the same answer
                "extra_info": {**(row["extra_info"] or {}), "index": len(rows) + len(new)},
            })
        self.stats = {"asked": len(picked), "kept": len(new), "model": model.usage.as_dict()}
        return datasets.Dataset.from_list(new)
