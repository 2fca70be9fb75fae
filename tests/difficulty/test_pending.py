"""The frontier sampler weighs what the trainer saw before a round commits it: the batch ends
pending in the store's inbox count from their step on, once a version covers them they
count from the record alone (not twice), rollouts it cannot read are left out, ranks agree
on the batch ends as on the version, and a resumed plan draws what the first would have."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dyngen.difficulty.frontier import FrontierPlan, FrontierSampler
from dyngen.difficulty.record import DIFFICULTY_COLUMN, LINEAGE_KEY, Observation, write_observations
from dyngen.store import Store
from dyngen.store.keys import prompt_key
from dyngen.trainers.row_stream import RowStream
from tests.rows import verl_row, verl_rows

RUN = "run-a"


def key(i: int) -> int:
    return prompt_key(verl_row(i)["prompt"])


def group(i: int, passed: int, samples: int = 8) -> list[dict[str, Any]]:
    """A trainer's completions of row i: `passed` of `samples` scored 1."""
    return [{"prompt": verl_row(i)["prompt"], "completion": f"c{j}",
             "score": 1.0 if j < passed else 0.0} for j in range(samples)]


@pytest.fixture
def store(tmp_path: Path) -> Store:
    """Rows 0-9; a version whose record measured rows 0-1 at step 4 (always right)."""
    store = Store(tmp_path / "store")
    store.create("ds", verl_rows(10))
    entry = {"observations": write_observations(
        store, "ds", [Observation(key(i), 4, 8, 8) for i in (0, 1)])}
    store.append("ds", verl_rows(1, start=100), lineage={LINEAGE_KEY: entry})
    return store


def plan_for(store: Store, sampler: FrontierSampler | None = None, seed: int = 0
             ) -> FrontierPlan:
    plan = FrontierPlan(seed, sampler or FrontierSampler(), Store(store.root), "ds")
    head = store.head("ds")
    plan.update(None, head, False, store.load("ds", head.version))
    plan.fold(plan.pending_at(head.version))
    return plan


def drawn(plan: FrontierPlan, blocks: int = 30) -> set[int]:
    return {i for _ in range(blocks) for i in plan.take(2, len(plan.weights))}


def test_a_pending_batch_end_weighs_the_next_draw_before_any_round_covers_it(
        store: Store) -> None:
    # Before: only rows 0-1 are measured, both always right: they are all it can draw.
    assert drawn(plan_for(store)) == {0, 1}
    store.write_batch_end("ds", RUN, 6, {"loss": 0.1}, group(5, 4) + group(7, 3) + group(0, 8))
    plan = plan_for(store)
    assert plan.folded == [(RUN, 6)]
    assert plan.weights[5] > 0.9 and plan.weights[7] > 0.8  # mixed at step 6: the frontier
    assert plan.weights[0] < plan.weights[5] / 2  # right 16 of 16 times now
    assert {5, 7} <= drawn(plan)
    shown = plan.shown(5)
    assert shown["last_step"] == 6 and shown["samples"] == 8 and shown["pass_rate"] == 0.5
    # Asked not to, it weighs the versions' record alone.
    assert drawn(plan_for(store, FrontierSampler(inbox=False))) == {0, 1}


def test_once_a_version_covers_the_batch_end_its_groups_count_once(store: Store) -> None:
    store.write_batch_end("ds", RUN, 6, None, group(5, 4))
    before = plan_for(store)
    assert before.shown(5)["samples"] == 8
    # A round commits the groups it covered (as dyngen.difficulty.observe writes them).
    entry = {"observations": write_observations(store, "ds", [Observation(key(5), 6, 4, 8)])}
    store.append("ds", verl_rows(1, start=101), lineage={LINEAGE_KEY: entry},
                 covers=[(RUN, 6)])
    after = plan_for(store)
    assert after.folded == [] and after.shown(5)["samples"] == 8
    # A plan that read the old version moves on: the record, not the inbox, counts it now.
    head = store.head("ds")
    before.update(store.record("ds", head.version - 1), head, True, store.load("ds"))
    before.fold(before.pending_at(head.version))
    assert before.shown(5)["samples"] == 8 and before.folded == []


def test_a_version_that_covers_other_batch_ends_leaves_the_pending_one_weighed(
        store: Store) -> None:
    store.write_batch_end("ds", RUN, 6, None, group(5, 4))
    plan = plan_for(store)
    # Another round commits, covering nothing of this run: step 6 is still pending.
    store.append("ds", verl_rows(1, start=102))
    head = store.head("ds")
    plan.update(store.record("ds", head.version - 1), head, True, store.load("ds"))
    plan.fold(plan.pending_at(head.version))
    assert plan.folded == [(RUN, 6)]
    assert plan.shown(5)["samples"] == 8 and plan.weights[5] > 0.9


@pytest.mark.parametrize("rollouts", [
    [{"prompt": "not a row of the dataset", "score": 1.0}],
    [{"completion": "no prompt", "score": 1.0}, "a string", 7, None, ["a", "list"]],
    [{"prompt": verl_row(5)["prompt"], "score": s} for s in (True, "1", None, [1])],
])
def test_rollouts_it_cannot_weigh_are_left_out_and_the_rest_still_count(
        store: Store, rollouts: list[Any]) -> None:
    store.write_batch_end("ds", RUN, 6, None, rollouts + group(7, 2))
    plan = plan_for(store)
    assert plan.weights[5] == 0 and plan.weights[7] > 0.5
    assert plan.shown(7)["samples"] == 8


def test_a_batch_end_whose_rollouts_file_is_gone_is_passed_over(store: Store) -> None:
    big = group(5, 4) + [{"prompt": verl_row(6)["prompt"], "score": 0.5, "pad": "x" * 40_000}]
    entry = store.write_batch_end("ds", RUN, 6, None, big)
    assert entry.rollouts is not None and entry.rollouts.path is not None  # beside the entry
    (store.root / "ds" / entry.rollouts.path).unlink()
    store.write_batch_end("ds", RUN, 7, None, group(7, 4))
    plan = plan_for(store)
    assert plan.weights[5] == 0 and plan.weights[7] > 0.9


def test_the_draw_with_pending_batch_ends_resumes_exactly(store: Store) -> None:
    store.write_batch_end("ds", RUN, 6, None, group(5, 4) + group(6, 3) + group(7, 5))
    whole = plan_for(store, seed=3)
    first = [whole.take(2, 11) for _ in range(6)]
    half = plan_for(store, seed=3)
    done = [half.take(2, 11) for _ in range(2)]
    state = half.state_dict()
    assert state["pending"] == [[RUN, 6]]
    resumed = FrontierPlan(3, FrontierSampler(), Store(store.root), "ds")
    head = store.head("ds")
    resumed.update(None, head, False, store.load("ds", head.version))
    resumed.load_state_dict(state)
    assert done + [resumed.take(2, 11) for _ in range(4)] == first


def test_ranks_weigh_the_same_batch_ends_for_each_block(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    streams = [RowStream(store.root, "ds", seed=0, block_rows=2, run_id="train-1",
                         sampler=FrontierSampler()).positioned() for _ in range(2)]
    first = [next(streams[0]) for _ in range(2)]  # rank 0 decides block 0
    store.write_batch_end("ds", RUN, 6, None, group(5, 4) + group(7, 4))
    # Rank 1 reads block 0 after the batch end was written: it draws what rank 0 drew.
    assert [row[3] for row in (next(streams[1]) for _ in range(2))] == [r[3] for r in first]
    later = [[next(s) for _ in range(2)] for s in streams]  # block 1: both see it
    assert [r[3] for r in later[0]] == [r[3] for r in later[1]]
    # Rows 5 and 7, mixed at step 6, weigh four times what rows 0 and 1 do.
    steps = {r[3]: r[4][DIFFICULTY_COLUMN]["last_step"] for r in later[1]}
    assert {5, 7} & set(steps) and all(steps[i] == 6 for i in {5, 7} & set(steps))
