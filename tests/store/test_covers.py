"""Versions cover batch ends: each at most once, each run's steps in order, and what no
version covers is pending. The covered set is carried by states and checkpoints."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dyngen.store import (
    AlreadyCoveredError,
    BatchEndError,
    CoverageOrderError,
    Covered,
    NotInInboxError,
    Store,
    gc,
    verify,
)
from tests.rows import verl_rows

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "format1_store"


def keys(entries) -> list[tuple[str, int]]:
    return [e.key for e in entries]


def new_dataset(store: Store) -> Store:
    store.create("ds", verl_rows(1))
    return store


def test_a_version_covers_what_is_pending_and_it_stops_being_pending(
        open_store: Callable[..., Store]) -> None:
    store = new_dataset(open_store())
    for run, step in (("a", 1), ("b", 5), ("a", 2)):
        store.write_batch_end("ds", run, step, {"m": float(step)})
    pending = open_store().pending("ds")
    assert keys(pending) == [("a", 1), ("a", 2), ("b", 5)]
    record = store.append("ds", verl_rows(1, start=1), covers=pending)
    assert record.covers == (("a", 1), ("a", 2), ("b", 5))
    store.write_batch_end("ds", "b", 6)
    fresh = open_store()
    assert keys(fresh.pending("ds")) == [("b", 6)]
    assert keys(fresh.pending("ds", version=0)) == [("a", 1), ("a", 2), ("b", 5), ("b", 6)]
    assert fresh.pending_keys("ds", 1) == [("b", 6)]  # listed only: the frontier's cheap look
    assert fresh.pending_keys("ds", 0) == keys(fresh.pending("ds", version=0))
    assert fresh.covering_version("ds", "a", 2) == 1
    assert fresh.covering_version("ds", "b", 6) is None
    assert fresh.covering_version("ds", "a", 2, version=0) is None
    assert fresh.record("ds", 1).covers == record.covers
    assert ("b", 5) in fresh.state("ds").covered and ("b", 6) not in fresh.state("ds").covered
    assert verify(fresh, "ds") == []


def test_a_lost_race_for_the_same_batch_ends_commits_nothing(
        open_store: Callable[..., Store]) -> None:
    store = new_dataset(open_store())
    store.write_batch_end("ds", "run", 1)
    store.write_batch_end("ds", "run", 2)
    mine, theirs = open_store(), open_store()
    slow = mine.prepare_append("ds", verl_rows(1, start=10), covers=mine.pending("ds"))
    fast = theirs.append("ds", verl_rows(1, start=20), covers=theirs.pending("ds"))
    with pytest.raises(AlreadyCoveredError) as caught:
        mine.commit_with_rebase(slow)
    error = caught.value
    assert (error.version, error.head, error.entries) == (1, 1, (("run", 1), ("run", 2)))
    assert "Nothing was committed" in str(error)
    fresh = open_store()
    assert fresh.head_version("ds") == fast.version == 1
    assert gc(fresh, "ds", grace_seconds=0, dry_run=True) == []  # its shards were removed
    with pytest.raises(AlreadyCoveredError):  # and through append, on the head at once
        mine.append("ds", verl_rows(1, start=30), covers=[("run", 2)])
    assert gc(fresh, "ds", grace_seconds=0, dry_run=True) == []


def test_a_commit_partly_covered_meanwhile_is_refused_whole(tmp_path: Path) -> None:
    store = new_dataset(Store(tmp_path))
    store.write_batch_end("ds", "run", 1)
    early = Store(tmp_path).pending("ds")  # a round that started before step 2 was written
    store.write_batch_end("ds", "run", 2)
    late = store.prepare_append("ds", verl_rows(1, start=5), covers=store.pending("ds"))
    Store(tmp_path).append("ds", verl_rows(1, start=6), covers=early)
    with pytest.raises(AlreadyCoveredError) as caught:
        store.commit_with_rebase(late)
    assert caught.value.entries == (("run", 1),)
    assert keys(Store(tmp_path).pending("ds")) == [("run", 2)]  # read again, run again
    store.append("ds", verl_rows(1, start=7), covers=Store(tmp_path).pending("ds"))
    assert Store(tmp_path).pending("ds") == []
    assert Store(tmp_path).head_version("ds") == 2


def test_an_idempotency_key_recommit_returns_its_version(tmp_path: Path) -> None:
    store = new_dataset(Store(tmp_path))
    store.write_batch_end("ds", "run", 1)
    pending = store.pending("ds")
    first = Store(tmp_path).prepare_append("ds", verl_rows(1, start=1), covers=pending,
                                           idempotency_key="event:1")
    retry = Store(tmp_path).prepare_append("ds", verl_rows(1, start=1), covers=pending,
                                           idempotency_key="event:1")
    landed = Store(tmp_path).commit_with_rebase(first)
    again = Store(tmp_path).commit_with_rebase(retry)  # a re-delivered round, raced
    assert again.version == landed.version == 1
    late = Store(tmp_path).append("ds", verl_rows(1, start=1), covers=pending,
                                  idempotency_key="event:1")  # re-delivered, later
    assert late.version == 1 and Store(tmp_path).head_version("ds") == 1
    assert gc(store, "ds", grace_seconds=0, dry_run=True) == []


def test_each_runs_steps_are_covered_in_order(tmp_path: Path) -> None:
    store = new_dataset(Store(tmp_path))
    for step in (1, 2, 4):
        store.write_batch_end("ds", "run", step)
    store.write_batch_end("ds", "other", 9)
    with pytest.raises(CoverageOrderError, match="covers run 'run' step 4 but not step 2"):
        store.append("ds", [], covers=[("run", 1), ("run", 4)])
    with pytest.raises(NotInInboxError, match="run 'run' step 3"):
        store.append("ds", [], covers=[("run", 1), ("run", 3)])
    assert store.head_version("ds") == 0
    assert store.append("ds", [], covers=[("run", 1), ("run", 2), ("other", 9)]).version == 1
    assert store.append("ds", [], covers=[("run", 4)]).version == 2
    store.write_batch_end("ds", "run", 3)  # late: after step 4 was covered
    assert keys(store.pending("ds")) == [("run", 3)]
    assert store.append("ds", [], covers=store.pending("ds")).covers == (("run", 3),)
    assert store.state("ds").covered.steps("run") == [1, 2, 3, 4]


def test_a_step_written_late_during_a_round_refuses_its_commit(tmp_path: Path) -> None:
    store = new_dataset(Store(tmp_path))
    store.write_batch_end("ds", "run", 5)
    pending = store.prepare_append("ds", verl_rows(1, start=1), covers=store.pending("ds"))
    Store(tmp_path).write_batch_end("ds", "run", 4)  # a trainer's retry queue, draining
    with pytest.raises(CoverageOrderError, match="arrived late"):
        store.commit_with_rebase(pending)
    assert store.head_version("ds") == 0
    assert gc(store, "ds", grace_seconds=0, dry_run=True) == []
    store.append("ds", verl_rows(1, start=1), covers=store.pending("ds"))
    assert Store(tmp_path).pending("ds") == []


@pytest.mark.parametrize("covers", [[("run", -1)], [("", 1)], ["run"], "run", [("run",)],
                                    [("run", 1.5)]])
def test_malformed_covers_are_refused_before_anything_is_written(tmp_path: Path,
                                                                 covers: object) -> None:
    store = new_dataset(Store(tmp_path))
    with pytest.raises(BatchEndError, match="expected"):
        store.append("ds", verl_rows(1, start=1), covers=covers)
    assert gc(store, "ds", grace_seconds=0, dry_run=True) == []


def test_checkpoints_carry_the_covered_set_compactly(tmp_path: Path) -> None:
    store = new_dataset(Store(tmp_path, checkpoint_interval=4))
    for step in range(0, 1000, 10):  # a trainer that ends a batch every 10 steps
        store.write_batch_end("ds", "run", step)
        store.write_batch_end("ds", "other", step // 10)
        store.append("ds", [], covers=store.pending("ds"), compact=False)
    checkpoint = tmp_path / "ds" / "_checkpoints" / f"{100:020d}.json"
    body = json.loads(checkpoint.read_text().splitlines()[1])
    assert body["covered"] == {"other": [[0, 1, 100]], "run": [[0, 10, 100]]}
    fresh = Store(tmp_path)
    assert fresh.state("ds").covered == store.state("ds").covered
    assert len(fresh.state("ds").covered) == 200 and fresh.pending("ds") == []
    assert fresh.covering_version("ds", "run", 0) == 1  # far back: found by bisection
    assert fresh.covering_version("ds", "other", 99) == 100
    assert fresh.covering_version("ds", "other", 60) == 61
    assert verify(fresh, "ds") == []  # checkpoints agree with replaying the records


def test_a_restore_keeps_what_is_covered(tmp_path: Path) -> None:
    store = new_dataset(Store(tmp_path))
    store.write_batch_end("ds", "run", 1)
    store.append("ds", verl_rows(1, start=1), covers=store.pending("ds"))
    store.restore("ds", 0)
    assert Store(tmp_path).pending("ds") == []  # restored rows, not a resurrected inbox
    assert Store(tmp_path).covering_version("ds", "run", 1) == 1


def test_an_old_store_reads_as_covering_nothing_and_takes_covers(tmp_path: Path) -> None:
    shutil.copytree(FIXTURE, tmp_path / "store")
    store = Store(tmp_path / "store")
    assert all(not r.covers for r in store.history("old"))
    store.write_batch_end("old", "run", 1)
    assert keys(store.pending("old", version=3)) == [("run", 1)]
    record = store.append("old", verl_rows(1, start=900), covers=store.pending("old"))
    assert (record.version, record.covers) == (6, (("run", 1),))
    assert Store(tmp_path / "store").pending("old") == []
    assert verify(Store(tmp_path / "store"), "old") == []


@settings(max_examples=60, deadline=None, database=None)
@given(batches=st.lists(st.lists(st.tuples(st.sampled_from("ab"), st.integers(0, 40)),
                                 max_size=6), max_size=8),
       order=st.randoms(use_true_random=False))
def test_the_covered_set_is_exact_and_canonical(batches, order) -> None:
    covered, expected = Covered(), set()
    for batch in batches:
        covered = covered.with_keys(batch)
        expected |= set(batch)
    every = sorted(expected)
    assert sorted(covered.keys()) == every and len(covered) == len(every)
    assert all((run, s) in covered for run, s in every)
    assert not any((run, s) in covered for run in "abc" for s in range(-1, 45)
                   if (run, s) not in expected)
    shuffled = list(every)
    order.shuffle(shuffled)
    one_by_one = Covered()
    for key in shuffled:
        one_by_one = one_by_one.with_keys([key])
    assert one_by_one == covered  # the same set, the same value, whatever the order
    assert Covered.from_json(json.loads(json.dumps(covered.to_json()))) == covered
