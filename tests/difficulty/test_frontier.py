"""The frontier sampler over a real store: weights from the difficulty record, rows never
measured, retired or stale left out, deterministic from its seed, resumed exactly from its
state, and drawn by TRL's FollowingDataset and the verifiers taskset when they name it."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from dyngen.difficulty.frontier import FrontierPlan, FrontierSampler, sampler_of
from dyngen.difficulty.record import DIFFICULTY_COLUMN, LINEAGE_KEY, Observation, write_observations
from dyngen.errors import ConfigError
from dyngen.store import Store
from dyngen.store.keys import prompt_key
from dyngen.trainers.row_stream import RowStream
from tests.rows import verl_row, verl_rows


def key(i: int) -> int:
    return prompt_key(verl_row(i)["prompt"])


def observe(store: Store, observations: list[Observation], retired: list[int] = ()) -> None:
    """A version that records `observations` (and retires rows `retired`)."""
    entry = {"observations": write_observations(store, "ds", observations),
             "retired": [{"key": f"{key(i):016x}", "why": "all_right"} for i in retired]}
    store.append("ds", verl_rows(1, start=1000 + len(store.versions("ds"))),
                 lineage={LINEAGE_KEY: entry})


@pytest.fixture
def store(tmp_path: Path) -> Store:
    store = Store(tmp_path / "store")
    store.create("ds", verl_rows(10))
    # rows 0-3: at the edge (4 of 8), row 4: always right, row 5: measured long ago,
    # row 6: retired, rows 7-9: never measured.
    obs = [Observation(key(i), 20, 4, 8) for i in range(4)]
    obs += [Observation(key(4), 20, 8, 8), Observation(key(5), 2, 4, 8),
            Observation(key(6), 20, 4, 8)]
    observe(store, obs, retired=[6])
    return store


def plan_for(store: Store, sampler: FrontierSampler, seed: int = 0) -> FrontierPlan:
    plan = FrontierPlan(seed, sampler, Store(store.root), "ds")
    head = store.head("ds")
    plan.update(None, head, False, store.load("ds", head.version))
    return plan


def test_weights_favour_rows_at_the_edge_and_leave_out_retired_stale_and_unmeasured(
        store: Store) -> None:
    plan = plan_for(store, FrontierSampler(group=8, max_age_steps=8))
    w = plan.weights
    assert all(w[i] > 0.8 for i in range(4))  # 4 of 8 right: a mixed group is likely
    assert 0 < w[4] < w[0] / 2  # 8 of 8 right: rarely mixed
    assert w[5] == w[6] == 0 and all(w[i] == 0 for i in range(7, 11))
    drawn = [i for _ in range(50) for i in plan.take(2, len(w))]
    assert set(drawn) <= {0, 1, 2, 3, 4} and {0, 1, 2, 3} <= set(drawn)
    asked = plan_for(store, FrontierSampler(unmeasured=True)).weights
    assert all(asked[i] > 0 for i in range(7, 11)) and asked[6] == 0  # retired stays out


def test_sharpness_draws_the_likeliest_rows_more_often(store: Store) -> None:
    plain = plan_for(store, FrontierSampler(group=8)).weights
    sharp = plan_for(store, FrontierSampler(group=8, sharpness=4.0))
    assert sharp.weights[4] / sharp.weights[0] == pytest.approx((plain[4] / plain[0]) ** 4)
    assert sharp.weights[5] == 0 and sharp.weights[6] == 0  # what weighed nothing still does
    # Each row is still drawn once before any twice; sharpness puts the likeliest first.
    def early(sampler: FrontierSampler) -> int:
        """Of 100 seeds, how often the always-right row is among a cycle's first 2 draws."""
        return sum(4 in plan_for(store, sampler, seed).take(2, 11) for seed in range(100))

    assert early(FrontierSampler(group=8, sharpness=4.0)) * 4 < early(FrontierSampler(group=8))


def test_the_draw_is_deterministic_from_the_seed_and_resumes_exactly(store: Store) -> None:
    sampler = FrontierSampler(unmeasured=True)
    whole = plan_for(store, sampler, seed=3)
    first = [whole.take(3, 11) for _ in range(6)]
    again = plan_for(store, sampler, seed=3)
    assert [again.take(3, 11) for _ in range(6)] == first
    other = plan_for(store, sampler, seed=4)
    assert [other.take(3, 11) for _ in range(6)] != first
    # Interrupted after two blocks: a new plan given the saved state draws what was next.
    half = plan_for(store, sampler, seed=3)
    done = [half.take(3, 11) for _ in range(2)]
    state = half.state_dict()
    resumed = plan_for(store, sampler, seed=3)
    resumed.load_state_dict(state)
    assert done + [resumed.take(3, 11) for _ in range(4)] == first
    # Within a record, a row comes again only once every drawable row has been drawn.
    # 9 drawable rows: 11 but row 5 (stale) and row 6 (retired).
    assert sorted(set(sum(first[:3], []))) == [0, 1, 2, 3, 4, 7, 8, 9, 10]


def test_with_nothing_measured_it_draws_uniformly_and_says_so_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="dyngen")
    store = Store(tmp_path / "s")
    store.create("ds", verl_rows(5))
    plan = plan_for(store, FrontierSampler())
    drawn = {i for _ in range(20) for i in plan.take(2, 5)}
    assert drawn == set(range(5))
    assert caplog.text.count("no row has a recent measurement") == 1


def test_a_sampler_is_named_or_refused_saying_what_is_expected() -> None:
    assert sampler_of("fresh_first") is None and sampler_of(None) is None
    assert sampler_of("frontier") == FrontierSampler()
    assert sampler_of({"group": 4}).group == 4
    with pytest.raises(ConfigError, match="expected one of fresh_first, frontier"):
        sampler_of("newest")
    for bad in ({"group": 1}, {"group": "8"}, {"group": 8.0}, {"max_age_steps": -1},
                {"half_life_steps": 0}, {"half_life_steps": float("nan")},
                {"recency_half_life": 0}, {"recency_half_life": "2"},
                {"pass_threshold": float("inf")}, {"pass_threshold": True},
                {"sharpness": 0}, {"sharpness": "4"}, {"sharpness": float("inf")}):
        name = next(iter(bad))
        with pytest.raises(ConfigError, match=f"FrontierSampler.{name}: expected .*found"):
            FrontierSampler(**bad)
    assert FrontierSampler(recency_half_life=None).recency_half_life is None  # the default


def test_the_stream_draws_by_the_record_and_shows_each_rows_estimate(store: Store) -> None:
    stream = RowStream(store.root, "ds", seed=0, block_rows=4, run_id=None,
                       sampler=FrontierSampler())
    rows: list[dict[str, Any]] = []
    for _, row in stream():
        rows.append(row)
        if len(rows) == 20:
            break
    indices = {r["extra_info"]["index"] for r in rows}
    assert indices <= {0, 1, 2, 3, 4}
    shown = rows[0][DIFFICULTY_COLUMN]
    assert set(shown) == {"pass_rate", "samples", "last_step", "weight"}
    assert shown["last_step"] == 20 and shown["samples"] == 8


def test_following_dataset_takes_the_sampler_by_name(store: Store) -> None:
    from dyngen.trainers.trl import FollowingDataset

    ds = FollowingDataset(store.root, "ds", block_rows=4, sampler="frontier")
    first = [row["extra_info"]["index"] for _, row in zip(range(12), ds, strict=False)]
    assert set(first) <= {0, 1, 2, 3, 4}
    assert ds.shuffle(seed=1).sampler == "frontier"
    baseline = FollowingDataset(store.root, "ds", block_rows=4)
    assert {row["extra_info"]["index"] for _, row in zip(range(40), baseline, strict=False)} \
        >= {5, 6, 7, 8, 9}  # today's order draws every row


def test_a_version_without_rows_gives_no_rows_and_does_not_hang(tmp_path: Path) -> None:
    store = Store(tmp_path / "s")
    store.create("ds", verl_rows(2))
    plan = plan_for(store, FrontierSampler())
    assert plan.take(4, 0) == [] and plan.take(0, 2) == []
    assert sorted(plan.take(4, 2)) == [0, 0, 1, 1]  # two rows, four draws: each twice


def test_a_rows_newest_group_outweighs_its_older_evidence(tmp_path: Path) -> None:
    store = Store(tmp_path / "s")
    store.create("ds", verl_rows(4))
    # Rows 0 and 1 saw the same groups in opposite order; rows 2 and 3 likewise.
    observe(store, [Observation(key(0), 10, 4, 8), Observation(key(0), 12, 8, 8),
                    Observation(key(1), 10, 8, 8), Observation(key(1), 12, 4, 8),
                    Observation(key(2), 10, 4, 8), Observation(key(2), 12, 0, 8),
                    Observation(key(3), 10, 0, 8), Observation(key(3), 12, 4, 8)])
    w = plan_for(store, FrontierSampler()).weights
    assert w[1] > w[0] + 0.2 and w[3] > w[2] + 0.2  # mixed last time: likelier mixed next
    # Old evidence counting as much as new (a long half-life), the order hardly matters.
    flat = plan_for(store, FrontierSampler(half_life_steps=1000.0)).weights
    assert abs(flat[1] - flat[0]) < 0.01 and abs(flat[3] - flat[2]) < 0.01
