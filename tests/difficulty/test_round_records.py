"""A real generation round (a Prefect flow run on a real store) records what it observed of
its rows' difficulty in the version it commits, and the frontier sampler then reads it."""

from __future__ import annotations

from pathlib import Path

import pytest

from dyngen.difficulty.frontier import FrontierPlan, FrontierSampler
from dyngen.difficulty.record import LINEAGE_KEY, DifficultyBook
from dyngen.flows.generation_round import generation_round
from dyngen.store import Store
from dyngen.store.keys import prompt_key
from tests.flows.test_round_inbox import config
from tests.rows import verl_row, verl_rows

pytestmark = pytest.mark.usefixtures("prefect_server")


def test_a_round_records_the_trainers_groups_and_the_sampler_draws_by_them(
        tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    store.create("ds", verl_rows(4))
    groups = {0: 4, 1: 8, 2: 0}  # passes of 8 per row; row 3 was not trained on
    rollouts = [{"prompt": verl_row(i)["prompt"], "score": float(j < passed)}
                for i, passed in groups.items() for j in range(8)]
    store.write_batch_end("ds", "run-a", 6, {"reward": 0.5}, rollouts)
    generation_round("ds", config(str(store.root), tmp_path / "seen.json"),
                     {"event_id": "e6", "run": "run-a", "step": 6})
    again = Store(store.root)  # a fresh process's view
    head = again.head("ds")
    entry = head.lineage[LINEAGE_KEY]
    assert (entry["observations"]["count"], entry["now"]) == (3, 6)
    book = DifficultyBook.at(again, "ds", head.version)
    assert {i: book.recent(prompt_key(verl_row(i)["prompt"]), 8) for i in range(4)} == {
        0: (4, 8), 1: (8, 8), 2: (0, 8), 3: (0, 0)}
    plan = FrontierPlan(0, FrontierSampler(), again, "ds")
    plan.update(None, head, False, again.load("ds", head.version))
    assert plan.weights[0] > plan.weights[1] > 0 and plan.weights[3] == 0
