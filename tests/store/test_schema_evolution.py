"""Rounds may add fields inside extra_info (e.g. a proposer's seed and model per row):
the dataset's schema grows from that version on, older rows read them as null, and every
other difference is still refused."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from dyngen.errors import SchemaMismatchError
from dyngen.store import Store, verify
from dyngen.trainers.verl_format import export_version
from tests.rows import verl_row_with, verl_rows


@pytest.fixture
def store(open_store) -> Store:
    """Version 0 of two rows, on each backend (tests/store/conftest.py)."""
    s = open_store()
    s.create("ds", verl_rows(2))
    return s


def stored_files(store: Store) -> list[str]:
    """Every file of dataset `ds`, through the store's backend."""
    return sorted(f"{sub}/{name}" for sub in ("data", "rejected", "_versions", "_checkpoints")
                  for name in store.backend.list(f"ds/{sub}"))


def tagged(i: int, **extra: object) -> dict:
    return verl_row_with(i, extra_info={"index": i, "split": "train", **extra})


def test_new_extra_info_fields_are_kept_and_old_rows_read_null(store: Store) -> None:
    store.append("ds", [tagged(2, seed_index=0, model="smollm2")], generator="Proposer")
    store.append("ds", [tagged(3, seed_index=1, score=0.25)])
    head = store.load("ds")
    assert head["extra_info"] == [
        {"index": 0, "split": "train", "seed_index": None, "model": None, "score": None},
        {"index": 1, "split": "train", "seed_index": None, "model": None, "score": None},
        {"index": 2, "split": "train", "seed_index": 0, "model": "smollm2", "score": None},
        {"index": 3, "split": "train", "seed_index": 1, "model": None, "score": 0.25},
    ]
    # Time travel reads each version in the schema it was committed with.
    assert store.load("ds", 0)["extra_info"][0] == {"index": 0, "split": "train"}
    assert list(store.load("ds", 1).features["extra_info"]) == [
        "index", "split", "seed_index", "model"]
    assert verify(store, "ds") == []
    # Older shards stay memory-mapped: reading them in the wider schema copies nothing.
    assert all(f["filename"].endswith(".arrow") for f in head.cache_files)
    assert len(head.cache_files) == 3


def test_rows_without_the_new_fields_still_append(store: Store) -> None:
    store.append("ds", [tagged(2, seed_index=0)])
    store.append("ds", verl_rows(1, start=3))
    assert store.load("ds")["extra_info"][3] == {"index": 3, "split": "train",
                                                  "seed_index": None}


def test_export_of_an_evolved_dataset_is_one_verl_parquet(store: Store, tmp_path: Path) -> None:
    store.append("ds", [tagged(2, model="m")])
    out = export_version(store, "ds", tmp_path / "out.parquet")
    rows = pq.read_table(out).to_pylist()
    assert [r["extra_info"].get("model") for r in rows] == [None, None, "m"]


def test_other_schema_changes_are_still_refused_with_nothing_written(store: Store) -> None:
    before = stored_files(store)
    with pytest.raises(SchemaMismatchError, match=r"surprise.*new fields may be added inside "
                                                  r"extra_info"):
        store.append("ds", [{**verl_rows(1, start=2)[0], "surprise": 1}])
    with pytest.raises(SchemaMismatchError, match="expected struct<index: int64, split: string>"):
        store.append("ds", [tagged(2, split=["not", "text"])])
    after = stored_files(store)
    assert after == before


def test_concurrent_rounds_adding_different_fields_both_land(store: Store) -> None:
    first = store.prepare_append("ds", [tagged(2, seed_index=7)])
    second = store.prepare_append("ds", [tagged(3, model="m")])
    store.commit(first)
    rec = store.commit_with_rebase(second)
    assert rec.version == 2
    assert store.load("ds")["extra_info"][2:] == [
        {"index": 2, "split": "train", "seed_index": 7, "model": None},
        {"index": 3, "split": "train", "seed_index": None, "model": "m"},
    ]
    assert verify(store, "ds") == []


def test_concurrent_rounds_giving_one_field_two_types_cannot_both_land(store: Store) -> None:
    first = store.prepare_append("ds", [tagged(2, seed=7)])
    second = store.prepare_append("ds", [tagged(3, seed=[1, 2])])
    store.commit(first)
    with pytest.raises(SchemaMismatchError, match="regenerate them against the new head"):
        store.commit_with_rebase(second)
    store.abort(second)
    assert store.head("ds").version == 1
    assert verify(store, "ds") == []
