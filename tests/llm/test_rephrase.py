"""`rephrase` against llama.cpp's server (SmolLM2): what it keeps states its source's numbers
and a solver agreed with the label; everything else is quarantined with its reason."""

from __future__ import annotations

import json

import datasets

from dyngen.generators.augment import RephraseAugmenter
from dyngen.generators.proposer.arithmetic import numbers_in
from dyngen.round import RoundContext, Trigger, call_generator
from tests.llm.llama_server import LlamaServer
from tests.llm.support import served

STORIES = [("Tom has 12 apples and buys 7 more. How many apples does he have?", "19"),
           ("What is 4 + 5?", "9"), ("A crate holds 6 jars. How many jars are in 3 crates?",
                                     "18")]


def test_rephrasings_are_kept_only_with_their_numbers_and_the_solvers_agreement(
        llama: LlamaServer) -> None:
    rows = [{"data_source": "dyngen-arithmetic", "ability": "math",
             "prompt": [{"role": "system", "content": "Answer with the final number only."},
                        {"role": "user", "content": q}],
             "reward_model": {"style": "rule", "ground_truth": a}, "extra_info": {"index": i}}
            for i, (q, a) in enumerate(STORIES)]
    gen = RephraseAugmenter(served(llama, model_name="smollm2", select="random",
                                   rows_per_round=3, variants_per_row=2, samples=2,
                                   agree=0.5, max_new_tokens=48, solve_max_tokens=24))
    batch = call_generator(gen, datasets.Dataset.from_list(rows),
                           RoundContext("stories", 1, 0, Trigger()))
    stats = gen.stats["methods"]["rephrase"]
    assert stats["made"] == len(batch) + sum(stats["rejected"].values()) > 0
    assert set(stats["rejected"]) <= {"numbers_changed", "solver_disagrees", "unchanged"}
    for row in batch:
        source = rows[row["extra_info"]["augmented_from"]["index"]]
        assert numbers_in(row["prompt"][-1]["content"]) == numbers_in(STORIES[
            row["extra_info"]["augmented_from"]["index"]][0])
        assert row["reward_model"] == source["reward_model"]
        assert row["prompt"][0] == source["prompt"][0]  # the system message stays
        assert row["extra_info"]["agreement"] >= 0.5
    for refused in batch.quarantined:  # each with its reason, and where it came from
        row = json.loads(refused["row"])
        assert refused["reason"] in stats["rejected"] and refused["detail"]
        if refused["reason"] != "unchanged":
            assert row["extra_info"]["augmented_from"]["method"] == "rephrase"
    assert gen.stats["model"]["requests"] == 3 and gen.stats["model"]["failures"] == 0
