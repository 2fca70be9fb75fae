"""A round short of what the trainer will draw asks its generator again (round.top_up):
through the real flow, under a temporary Prefect server."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from dyngen.flows.generation_round import generation_round
from dyngen.store import Store, verify
from tests.rows import verl_rows

pytestmark = pytest.mark.usefixtures("prefect_server")


@pytest.fixture
def store(tmp_path: Path) -> Store:
    store = Store(tmp_path / "store")
    store.create("ds", verl_rows(4))
    return store


def config(store: Store, name: str = "FewKeptPerCall", top_up: dict[str, Any] | None = None,
           **datagen: Any) -> dict[str, Any]:
    return {
        "store": {"root": str(store.root)},
        "data": {"filter_overlong_prompts": False,
                 "datagen": {"path": "pkg://tests.flows.gens", "name": name, **datagen}},
        "round": {"retries": 0, "retry_delay_seconds": 0, "top_up": top_up or {},
                  "filters": [{"path": "pkg://tests.flows.gens", "name": "KeepMarked"}]},
    }


def new_rows(store: Store) -> list[dict[str, Any]]:
    return [r for r in store.load("ds").to_list() if r["_dyngen_version"] == 1]


def test_a_short_round_asks_again_until_it_keeps_enough(store: Store) -> None:
    state = generation_round("ds", config(store, n=3, keep=2, top_up={"min_rows": 4}),
                             {"event_id": "e1", "step": 1}, return_state=True)
    assert state.is_completed(), state.message
    rows = new_rows(store)
    assert len(rows) == 4
    assert sorted(r["data_source"] for r in rows) == ["call-0"] * 2 + ["call-1"] * 2
    lineage = store.head("ds").lineage
    assert lineage["top_up"] == {"wanted": 4, "attempts": 2, "kept": [2, 4],
                                 "generated": [3, 3], "stopped": "enough"}
    assert lineage["counts"] == {"generated": 6, "kept": 4, "rejected": {"unmarked": 2}}
    # Every call's rejected row is in the quarantine, with its reason.
    rejected = store.load_rejected("ds", 1, round_only=True).to_list()
    assert sorted(r["reason"] for r in rejected) == ["unmarked", "unmarked"]
    assert verify(store, "ds") == []


def test_the_trainer_states_what_it_will_draw(store: Store) -> None:
    trigger = {"event_id": "e1", "step": 3, "metrics": {"dyngen/rows_wanted": 3.0}}
    state = generation_round("ds", config(store, n=2, keep=1), trigger, return_state=True)
    assert state.is_completed(), state.message
    assert len(new_rows(store)) == 3
    assert store.head("ds").lineage["top_up"]["attempts"] == 3


def test_without_a_minimum_the_generator_is_asked_once(store: Store) -> None:
    state = generation_round("ds", config(store, n=2, keep=1), {"event_id": "e1", "step": 3},
                             return_state=True)
    assert state.is_completed(), state.message
    assert len(new_rows(store)) == 1
    assert "top_up" not in store.head("ds").lineage


def test_the_budget_bounds_the_calls_and_the_round_says_it_is_short(
        store: Store, caplog: pytest.LogCaptureFixture) -> None:
    cfg = config(store, n=2, keep=1, top_up={"min_rows": 10, "max_attempts": 3})
    with caplog.at_level(logging.WARNING):
        state = generation_round("ds", cfg, {"event_id": "e1", "step": 1}, return_state=True)
    assert state.is_completed(), state.message
    assert len(new_rows(store)) == 3
    top_up = store.head("ds").lineage["top_up"]
    assert (top_up["attempts"], top_up["kept"], top_up["stopped"]) == (3, [1, 2, 3], "budget")
    assert any("kept 3 rows of the 10 wanted after 3 generator calls" in r.getMessage()
               for r in caplog.records)


def test_a_generator_that_repeats_itself_is_not_asked_a_third_time(
        store: Store, caplog: pytest.LogCaptureFixture) -> None:
    cfg = config(store, name="AddNewRows", n=2, top_up={"min_rows": 10, "max_attempts": 5})
    cfg["round"]["filters"] = []
    with caplog.at_level(logging.WARNING):
        state = generation_round("ds", cfg, {"event_id": "e1", "step": 1}, return_state=True)
    assert state.is_completed(), state.message
    assert len(new_rows(store)) == 2  # the second call's rows were the first's again
    top_up = store.head("ds").lineage["top_up"]
    assert (top_up["attempts"], top_up["stopped"]) == (2, "repeats")
    assert any("context.round_seed" in r.getMessage() for r in caplog.records)
