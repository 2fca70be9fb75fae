"""FollowingDataset: a seeded stream over the newest version, new rows first, the same on
every rank."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import Any

import pytest

from dyngen.errors import ConfigError
from dyngen.store import Store
from dyngen.trainers.trl import FollowingDataset
from tests.rows import verl_rows

NAME = "following"


def questions(stream: Iterator[dict[str, Any]], n: int) -> list[str]:
    return [row["prompt"][-1]["content"] for row in islice(stream, n)]


def q(i: int) -> str:
    return f"What is {i} + {i}?"


@pytest.fixture
def store(tmp_path: Path) -> Store:
    store = Store(tmp_path / "store")
    store.create(NAME, verl_rows(4))
    return store


def test_new_rows_come_first_then_passes_cover_every_row(store: Store) -> None:
    stream = iter(FollowingDataset(store.root, NAME, block_rows=2, seed=3))
    first_pass = questions(stream, 4)
    assert sorted(first_pass) == sorted(q(i) for i in range(4))
    store.append(NAME, verl_rows(2, start=10))
    assert questions(stream, 2) == [q(10), q(11)]  # the next block serves them first
    assert sorted(questions(stream, 6)) == sorted(q(i) for i in (0, 1, 2, 3, 10, 11))
    row = next(iter(FollowingDataset(store.root, NAME)))
    assert {"reward_model", "extra_info", "_dyngen_version"} <= set(row)


def test_shuffle_reseeds_instead_of_buffering(store: Store) -> None:
    base = FollowingDataset(store.root, NAME, seed=0)
    reseeded = base.shuffle(seed=1, buffer_size=1000)
    assert isinstance(reseeded, FollowingDataset) and reseeded.seed == 1
    orders = {tuple(questions(iter(FollowingDataset(store.root, NAME, seed=s)), 4))
              for s in range(4)}
    assert len(orders) > 1  # the seed picks the permutation
    assert questions(iter(base), 8) == questions(iter(FollowingDataset(store.root, NAME)), 8)


def test_every_rank_sees_the_same_sequence_whenever_it_reads(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    rank0 = iter(FollowingDataset(store.root, NAME, block_rows=2, run_id="run-7"))
    rank1 = iter(FollowingDataset(store.root, NAME, block_rows=2, run_id="run-7"))
    ahead = questions(rank0, 3)  # rank 0 reads blocks 0 and 1 before the commit
    store.append(NAME, verl_rows(2, start=10))
    behind = questions(rank1, 8)  # rank 1 reads them after it: still version 0's rows
    ahead += questions(rank0, 5)
    assert ahead == behind
    assert behind[4:6] == [q(10), q(11)]  # block 2, read after the commit, serves them
    with pytest.raises(ConfigError, match="run_id"):
        next(iter(FollowingDataset(store.root, NAME, block_rows=2)))


def test_rows_a_round_adds_come_first_even_when_a_compaction_committed_in_between(
        store: Store) -> None:
    stream = iter(FollowingDataset(store.root, NAME, block_rows=2, seed=3))
    questions(stream, 4)
    store.append(NAME, verl_rows(1, start=10))
    store.compact(NAME, full=True)  # rewrites the shards: same rows, same order
    store.append(NAME, verl_rows(1, start=11))
    assert questions(stream, 2) == [q(10), q(11)]
