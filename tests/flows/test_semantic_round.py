"""A round through the flow with round.semantic_duplicate on: paraphrases of stored rows are
quarantined, number variants and new tasks kept; after a restore the next round is checked
against exactly the restored rows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dyngen.flows.generation_round import generation_round
from dyngen.store import Store
from dyngen.store.embeddings import VectorSettings, embedder
from tests.rows import verl_row

pytestmark = pytest.mark.usefixtures("prefect_server")
SEED = ["Tom has 3 apples and buys 4 more apples at the market. How many apples does Tom "
        "have now?",
        "A rectangle has a length of 8 centimeters and a width of 5 centimeters. What is its "
        "area?"]
PARAPHRASE = ("Tom had 3 apples and bought 4 more apples at the market. How many apples does "
              "Tom have now?")
NUMBERS = ("Tom has 6 apples and buys 7 more apples at the market. How many apples does Tom "
           "have now?")
NEW = "Name the largest planet of the solar system and say what its atmosphere is made of."
AREA = ("A rectangle has a length of 8 centimeters and a width of 5 centimeters. What is the "
        "area of the rectangle?")
# Each task's reference answer: a paraphrase has its original's, so the answer gate lets the
# semantic filter judge it (dyngen.filters.answers).
ANSWERS = {SEED[0]: "7", SEED[1]: "40", PARAPHRASE: "7", NUMBERS: "13",
           NEW: "Jupiter: hydrogen and helium", AREA: "40"}


def config(store: Store, prompts: list[str]) -> dict[str, Any]:
    return {"store": {"root": str(store.root)},
            "data": {"filter_overlong_prompts": False,
                     "datagen": {"path": "pkg://tests.flows.gens", "name": "WritesPrompts",
                                 "prompts": prompts,
                                 "answers": [ANSWERS.get(p, ANSWERS[NEW]) for p in prompts]}},
            "round": {"retries": 0, "retry_delay_seconds": 0,
                      "semantic_duplicate": {"enabled": True}}}


def answered(row: dict[str, Any], answer: str) -> dict[str, Any]:
    return {**row, "reward_model": {**row["reward_model"], "ground_truth": answer}}


def prompts_of(store: Store) -> list[str]:
    return [p[-1]["content"] for p in store.load("ds")["prompt"]]


def test_a_round_quarantines_paraphrases_then_a_restore_and_the_next_round(
        tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    store.create("ds", [answered(verl_row(i, content=t), ANSWERS[t]) for i, t in enumerate(SEED)])
    model = embedder(VectorSettings())
    model._memo.clear()  # the process's memo may hold these texts from another test
    before = model.rows_embedded
    first = generation_round("ds", config(store, [PARAPHRASE, NUMBERS, NEW]), {"step": 1})
    # The 2 stored rows (indexed once, having no sidecar) and the 3 new ones: the new
    # shard's sidecar is written with the filter's vectors, not embedded again.
    assert model.rows_embedded - before == 5
    assert first["counts"]["rejected"] == {"semantic_duplicate": 1}
    assert prompts_of(store) == [*SEED, NUMBERS, NEW]
    (quarantined,) = store.load_rejected("ds").to_list()
    assert json.loads(quarantined["row"])["prompt"][-1]["content"] == PARAPHRASE
    assert quarantined["detail"].startswith(
        "semantic duplicate of row 0 of version 0 (added by version 0): cosine 0.9")
    lineage = store.head("ds").lineage["semantic_duplicate"]
    assert lineage["rows_embedded"] == 3 and lineage["embedding_seconds"] > 0
    assert store.head("ds").shards[-1].vec is not None  # written with the round's shard

    store.restore("ds", 0)
    # NEW is no longer in the dataset: it is kept again; AREA says row 1 again.
    second = generation_round("ds", config(store, [NEW + " Answer in one sentence.", AREA]),
                              {"step": 2})
    assert second["counts"]["rejected"] == {"semantic_duplicate": 1}
    assert prompts_of(store) == [*SEED, NEW + " Answer in one sentence."]
    detail = store.load_rejected("ds").to_list()[-1]["detail"]
    assert detail.startswith("semantic duplicate of row 1 of version 2 (added by version 0)")
