"""The linear log: records hold their change, checkpoints are an optimisation, keys are O(1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dyngen.store import Store, verify
from dyngen.store.backend import LocalBackend
from tests.rows import verl_rows


def _grow(store: Store, versions: int, *, keyed: bool = True) -> None:
    """Version 0 of 3 rows, then one row per version (with key `event:<v>`), uncompacted:
    these tests count records and shards."""
    store.create("ds", verl_rows(3))
    for v in range(1, versions):
        store.append("ds", verl_rows(1, start=2 + v), compact=False,
                     idempotency_key=f"event:{v}" if keyed else None)


def _record(store: Store, version: int) -> dict:
    return json.loads((store.dataset_dir("ds") / "_versions" / f"{version:020d}.json")
                      .read_text())


def indices(ds) -> list[int]:
    return [e["index"] for e in ds["extra_info"]]


class CountingBackend(LocalBackend):
    """The local backend, counting the files it reads."""

    reads: list[str]

    def read_bytes(self, rel: str) -> bytes:
        self.reads.append(rel)
        return super().read_bytes(rel)


def counting(store: Store) -> tuple[Store, list[str]]:
    """A fresh Store on the same root whose every file read is recorded."""
    fresh = Store(store.root, checkpoint_interval=store.checkpoint_interval)
    backend = CountingBackend(fresh.root)
    backend.reads = []
    fresh.backend = backend
    return fresh, backend.reads


def test_a_record_holds_only_its_change_so_records_do_not_grow(tmp_path: Path) -> None:
    store = Store(tmp_path, checkpoint_interval=10)
    _grow(store, 60)
    early, late = _record(store, 3), _record(store, 59)
    assert (late["format"], late["operation"], late["parent"]) == (2, "append", 58)
    assert [s["rows"] for s in late["added"]] == [1] and late["removed"] == []
    assert "shards" not in late  # the state is not repeated in every record
    size = (store.dataset_dir("ds") / "_versions" / f"{59:020d}.json").stat().st_size
    assert size <= 1.1 * (store.dataset_dir("ds") / "_versions" / f"{3:020d}.json").stat().st_size
    assert early["rows"] == 6 and late["rows"] == 62
    assert len(store.head("ds").shards) == 60  # the record a reader gets lists them all


def test_checkpoints_every_k_versions_and_a_hint_to_the_newest(tmp_path: Path) -> None:
    store = Store(tmp_path, checkpoint_interval=10)
    _grow(store, 35)
    folder = store.dataset_dir("ds") / "_checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == [
        f"{v:020d}.json" for v in (10, 20, 30)] + ["_last_checkpoint"]
    assert json.loads((folder / "_last_checkpoint").read_text()) == {"version": 30}
    fresh, reads = counting(store)
    assert indices(fresh.load("ds")) == list(range(37))
    records = [r for r in reads if "/_versions/" in r]
    assert sorted(records) == [f"ds/_versions/{v:020d}.json" for v in range(31, 35)]


@pytest.mark.parametrize("damage", ["delete checkpoint", "truncate checkpoint",
                                    "delete hint", "garbage hint"])
def test_a_damaged_checkpoint_or_hint_falls_back_to_replay(tmp_path: Path, damage: str) -> None:
    store = Store(tmp_path, checkpoint_interval=10)
    _grow(store, 25)
    expected = {v: store.load("ds", v).to_list() for v in (9, 10, 19, 20, 24)}
    folder = store.dataset_dir("ds") / "_checkpoints"
    target = folder / (f"{20:020d}.json" if "checkpoint" in damage else "_last_checkpoint")
    if damage.startswith("delete"):
        target.unlink()
    else:
        target.write_text(target.read_text()[:30] if "truncate" in damage else "{not json")
    fresh = Store(tmp_path, checkpoint_interval=10)
    assert {v: fresh.load("ds", v).to_list() for v in expected} == expected
    assert fresh.head_version("ds") == 24
    problems = verify(store, "ds")
    if damage == "truncate checkpoint":  # reported, with what to do; reads are unaffected
        assert [p.version for p in problems] == [20]
        assert "damaged" in problems[0].message and "delete it" in problems[0].message
    else:
        assert problems == []


def test_verify_finds_a_checkpoint_that_differs_from_replay(tmp_path: Path) -> None:
    store = Store(tmp_path, checkpoint_interval=10)
    _grow(store, 12)
    path = store.dataset_dir("ds") / "_checkpoints" / f"{10:020d}.json"
    state = store.log("ds").read_checkpoint(10)
    from dataclasses import replace

    wrong = replace(state, shards=state.shards[:-1], rows=state.rows - 1)  # a valid checksum
    path.write_text(wrong.to_json())
    problems = verify(store, "ds")
    assert [(p.version, "differs from replaying" in p.message) for p in problems] == [(10, True)]


def test_time_travel_across_checkpoints(tmp_path: Path) -> None:
    store = Store(tmp_path, checkpoint_interval=4)
    _grow(store, 14)
    fresh = Store(tmp_path, checkpoint_interval=4)
    for v in (0, 3, 4, 5, 8, 13):
        assert indices(fresh.load("ds", v)) == list(range(3 + v))


def test_an_idempotency_lookup_from_a_fresh_store_reads_a_few_files(tmp_path: Path) -> None:
    store = Store(tmp_path, checkpoint_interval=10)
    _grow(store, 120)
    fresh, reads = counting(store)
    assert fresh.find_idempotency_key("ds", "event:57").version == 57
    assert fresh.find_idempotency_key("ds", "event:119").version == 119  # the head: no marker
    assert fresh.find_idempotency_key("ds", "event:missing") is None
    versions_read = {r for r in reads if "/_versions/" in r}
    # Each found version's record and the records after its checkpoint; never the whole log.
    assert len(versions_read) <= 2 * 10 + 2, sorted(versions_read)


def test_each_keyed_version_below_the_head_has_a_marker(tmp_path: Path) -> None:
    store = Store(tmp_path)
    _grow(store, 6)
    log = store.log("ds")
    assert [log.marked_version(f"event:{v}") for v in range(1, 6)] == [1, 2, 3, 4, None]
    marker = store.dataset_dir("ds") / log.key_rel("event:3").split("/", 1)[1]
    marker.unlink()  # a store copied without its markers
    assert any("marker is missing" in p.message for p in verify(store, "ds"))
    marker.write_text("{damaged")
    assert Store(tmp_path).find_idempotency_key("ds", "event:3").version == 3  # reads the log


def test_history_and_entries_read_only_the_newest(tmp_path: Path) -> None:
    store = Store(tmp_path, checkpoint_interval=10)
    _grow(store, 40)
    fresh, reads = counting(store)
    assert [e.version for e in fresh.entries("ds", limit=3)] == [39, 38, 37]
    assert [e.version for e in fresh.entries("ds", limit=3, oldest_first=True)] == [37, 38, 39]
    assert len([r for r in reads if "/_versions/" in r]) == 3
    newest = fresh.history("ds", newest=2)
    assert [(r.version, r.rows) for r in newest] == [(38, 41), (39, 42)]
    assert [r.version for r in fresh.history("ds")] == list(range(40))


def test_checkpoint_interval_must_be_a_positive_integer(tmp_path: Path) -> None:
    for bad in (0, -5, 2.5, True):
        with pytest.raises(ValueError, match="checkpoint_interval: expected an integer >= 1"):
            Store(tmp_path, checkpoint_interval=bad)  # type: ignore[arg-type]
