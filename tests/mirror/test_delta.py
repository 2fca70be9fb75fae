"""The Delta mirror read by real engines (deltalake, Polars): Delta version k holds exactly
the rows of `store.load(name, k)` as a multiset (Delta tables have no row order)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import deltalake
import polars
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from dyngen.errors import MirrorError
from dyngen.mirror import mirror_delta
from dyngen.progress import Bar
from dyngen.store import Store
from tests.rows import verl_row_with, verl_rows

NAME = "ds"


def as_multiset(rows: list[dict[str, Any]]) -> list[str]:
    """Rows as sorted canonical JSON: equal lists mean the same rows, each as often."""
    return sorted(json.dumps(row, sort_keys=True) for row in rows)


def delta_rows(dest: Path | str, version: int, **options: Any) -> list[str]:
    return as_multiset(DeltaTable(str(dest), version=version, **options)
                       .to_pyarrow_table().to_pylist())


def polars_rows(dest: Path | str, version: int, **options: Any) -> list[str]:
    return as_multiset(polars.read_delta(str(dest), version=version, **options).to_dicts())


def round_lineage(i: int) -> dict[str, Any]:
    return {"round": i, "trigger": {"event_id": f"event-{i}", "step": 10 * i, "metrics": {},
                                    "rollouts": None}}


def grow(store: Store) -> dict[str, int]:
    """A history with every kind of version; returns the versions worth checking by role."""
    store.create(NAME, verl_rows(4))
    for i in (1, 2, 3):
        store.append(NAME, verl_rows(2, start=10 * i), generator="Gen", round_id=f"round-{i}",
                     idempotency_key=f"event:event-{i}", lineage=round_lineage(i))
    tagged = verl_row_with(40, extra_info={"index": 40, "split": "train", "model": "smollm2"})
    grown = store.append(NAME, [tagged], generator="Gen", lineage=round_lineage(4)).version
    compacted = store.compact(NAME, full=True)[-1].version
    restored = store.restore(NAME, 2).version  # before the growth: the schema narrows again
    head = store.append(NAME, verl_rows(2, start=60), lineage=round_lineage(5)).version
    return {"first": 0, "second": 1, "middle": 2, "grown": grown, "compacted": compacted,
            "restored": restored, "head": head}


@pytest.fixture(scope="module")
def mirrored(tmp_path_factory: pytest.TempPathFactory) -> tuple[Store, Path, dict[str, int]]:
    root = tmp_path_factory.mktemp("mirror")
    store = Store(root / "store")
    versions = grow(store)
    dest = root / "mirror"
    done = mirror_delta(store, NAME, dest)
    assert done.committed == tuple(range(versions["head"] + 1)) and done.version == \
        versions["head"]
    return store, dest, versions


@pytest.mark.parametrize("role", ["first", "second", "middle", "grown", "compacted", "restored",
                                  "head"])
def test_each_delta_version_holds_that_versions_rows(mirrored, role: str) -> None:
    store, dest, versions = mirrored
    k = versions[role]
    expected = as_multiset(store.load(NAME, k).to_list())
    assert delta_rows(dest, k) == expected
    assert polars_rows(dest, k) == expected


def test_extra_info_fields_a_round_adds_reach_the_mirror_and_leave_with_a_restore(
        mirrored) -> None:
    store, dest, versions = mirrored

    def extra_fields(version: int) -> list[str]:
        schema = pa.schema(DeltaTable(str(dest), version=version).schema().to_arrow())
        return [f.name for f in schema.field("extra_info").type]

    assert extra_fields(versions["middle"]) == ["index", "split"]
    assert extra_fields(versions["grown"]) == ["index", "split", "model"]
    grown = polars.read_delta(str(dest), version=versions["grown"])
    assert grown.filter(polars.col("extra_info").struct.field("index") == 40)[
        "extra_info"].struct.field("model").to_list() == ["smollm2"]
    assert extra_fields(versions["restored"]) == ["index", "split"]
    assert list(store.load(NAME, versions["restored"]).features["extra_info"]) == \
        ["index", "split"]


def test_each_commit_names_its_version_round_step_and_event(mirrored) -> None:
    store, dest, versions = mirrored
    history = {c["version"]: c for c in DeltaTable(str(dest)).history()}
    assert sorted(history) == list(range(versions["head"] + 1))
    for k, commit in history.items():
        record = store.record(NAME, k)
        assert (commit["dyngen.dataset"], commit["dyngen.version"],
                commit["dyngen.operation"]) == (NAME, k, record.operation)
    one = history[versions["second"]]
    assert (one["dyngen.round"], one["dyngen.step"], one["dyngen.event_id"]) == \
        (1, 10, "event-1")
    assert history[0]["dyngen.round"] is None and history[0]["dyngen.event_id"] is None
    digests = {role: history[versions[role]]["dyngen.schema"] for role in versions}
    assert digests["first"] == digests["second"] == digests["middle"] == digests["restored"]
    assert digests["grown"] == digests["compacted"] != digests["middle"]


def actions(dest: Path, version: int) -> list[dict[str, Any]]:
    """The actions of one Delta commit, as the Delta protocol's log file holds them."""
    text = (dest / "_delta_log" / f"{version:020d}.json").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_a_compaction_is_removes_and_adds_of_the_same_rows(mirrored) -> None:
    store, dest, versions = mirrored
    k = versions["compacted"]
    merged = store.record(NAME, k).lineage["compaction"]["shards_in"]
    removes = [a["remove"] for a in actions(dest, k) if "remove" in a]
    adds = [a["add"] for a in actions(dest, k) if "add" in a]
    assert len(removes) == merged and len(adds) == 1
    assert not any(a["dataChange"] for a in removes + adds)  # rows unchanged: not a change
    assert json.loads(adds[0]["stats"])["numRecords"] == store.record(NAME, k).rows
    assert delta_rows(dest, k) == delta_rows(dest, k - 1)


def test_an_append_adds_one_file_and_removes_nothing(mirrored) -> None:
    _, dest, versions = mirrored
    kinds = [next(iter(a)) for a in actions(dest, versions["middle"])]
    assert sorted(kinds) == ["add", "commitInfo"]


def test_rerunning_is_incremental_and_does_nothing_when_current(
        mirrored, tmp_path: Path) -> None:
    store, dest, versions = mirrored
    again = mirror_delta(store, NAME, dest)
    assert again.committed == () and again.version == versions["head"]
    assert DeltaTable(str(dest)).version() == versions["head"]


def test_a_new_version_is_one_new_commit(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    store.create(NAME, verl_rows(2))
    dest = tmp_path / "mirror"
    assert mirror_delta(store, NAME, dest).committed == (0,)
    store.append(NAME, verl_rows(3, start=2))
    store.append(NAME, verl_rows(1, start=5))
    assert mirror_delta(store, NAME, dest, up_to=1).committed == (1,)
    assert mirror_delta(store, NAME, dest).committed == (2,)
    assert delta_rows(dest, 2) == as_multiset(store.load(NAME).to_list())
    parquet = sorted(p.name for p in dest.glob("*.parquet"))
    assert len(parquet) == 3 and all(p.startswith("dyngen-") for p in parquet)


def test_a_vacuum_is_mirrored_and_deletes_the_files_it_deleted_in_the_store(
        tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    store.create(NAME, verl_rows(2))
    for i in range(3):
        store.append(NAME, verl_rows(1, start=2 + i))
    store.compact(NAME, full=True)  # v4: one shard; v0..v3's shards are no longer the head's
    dest = tmp_path / "mirror"
    mirror_delta(store, NAME, dest)
    before = {p.name for p in dest.glob("*.parquet")}
    vacuum = store.vacuum(NAME, keep_versions=1, grace_seconds=0)
    done = mirror_delta(store, NAME, dest)
    assert done.committed == (vacuum.record.version,) and done.deleted_files == 4
    assert len(before - {p.name for p in dest.glob("*.parquet")}) == 4
    assert delta_rows(dest, done.version) == as_multiset(store.load(NAME).to_list())
    with pytest.raises(OSError, match="(?i)not found|no such file"):
        DeltaTable(str(dest), version=1).to_pyarrow_table()  # as store.load refuses v1


def test_a_mirror_made_after_a_vacuum_names_the_files_retention_removed(
        tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    store.create(NAME, verl_rows(2))
    store.append(NAME, verl_rows(1, start=2))
    store.compact(NAME, full=True)
    store.vacuum(NAME, keep_versions=1, grace_seconds=0)
    dest = tmp_path / "mirror"
    done = mirror_delta(store, NAME, dest)
    assert done.committed == (0, 1, 2, 3)
    assert delta_rows(dest, 3) == as_multiset(store.load(NAME).to_list())
    assert len(list(dest.glob("*.parquet"))) == 1  # only the compacted shard still exists


def test_a_table_written_by_something_else_is_refused(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    store.create(NAME, verl_rows(2))
    dest = tmp_path / "mirror"
    mirror_delta(store, NAME, dest)
    deltalake.write_deltalake(str(dest), DeltaTable(str(dest)).to_pyarrow_table(),
                              mode="append")
    with pytest.raises(MirrorError) as err:
        mirror_delta(store, NAME, dest)
    for part in ("not a dyngen mirror of 'ds'", "Delta version 1", "dyngen.version=1",
                 "Something else wrote to it", "another DEST"):
        assert part in str(err.value), str(err.value)


def test_a_folder_of_other_files_is_refused_untouched(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    store.create(NAME, verl_rows(2))
    dest = tmp_path / "mirror"
    dest.mkdir()
    (dest / "notes.txt").write_text("mine")
    with pytest.raises(MirrorError, match=r"is not empty \(notes.txt\) and is not a Delta "
                                          r"table.*Choose another DEST"):
        mirror_delta(store, NAME, dest)
    assert [p.name for p in dest.iterdir()] == ["notes.txt"]


def test_a_mirror_of_another_history_is_refused(tmp_path: Path) -> None:
    dest = tmp_path / "mirror"
    old = Store(tmp_path / "old")
    old.create(NAME, verl_rows(2))
    old.append(NAME, verl_rows(1, start=2))
    mirror_delta(old, NAME, dest)
    remade = Store(tmp_path / "new")  # the dataset made again: versions 0 only
    remade.create(NAME, verl_rows(2))
    with pytest.raises(MirrorError) as err:
        mirror_delta(remade, NAME, dest)
    for part in ("ends with version 1", "the store has no such version (head 0)",
                 "Delete the mirror"):
        assert part in str(err.value), str(err.value)
    remade.append(NAME, verl_rows(1, start=7))  # a version 1 now, but not the mirrored one
    with pytest.raises(MirrorError, match="the store has a version committed at"):
        mirror_delta(remade, NAME, dest)
    assert DeltaTable(str(dest)).version() == 1


def test_bad_targets_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    store.create(NAME, verl_rows(2))
    with pytest.raises(MirrorError, match=r"up to version 5: expected a version in 0..0"):
        mirror_delta(store, NAME, tmp_path / "m", up_to=5)
    assert not (tmp_path / "m").exists()
    with pytest.raises(MirrorError, match="no memory:// filesystem"):
        mirror_delta(store, NAME, "memory://bucket/m")


class MirrorsAgainMidway(Bar):
    """After the first commit of one mirror run, another run mirrors to the head."""

    def __init__(self, again: Callable[[], object]) -> None:
        self.again, self.done = again, False

    def advance(self, amount: float = 1) -> None:
        if not self.done:
            self.done = True
            self.again()


def test_a_run_that_loses_a_race_goes_on_from_where_the_winner_stopped(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    store.create(NAME, verl_rows(2))
    for i in range(3):
        store.append(NAME, verl_rows(1, start=2 + i))
    dest = tmp_path / "mirror"
    other = MirrorsAgainMidway(lambda: mirror_delta(Store(store.root), NAME, dest))
    done = mirror_delta(store, NAME, dest, progress=other)
    assert other.done and done.committed == (0,)  # the other run committed 1..3
    assert done.version == 3 and DeltaTable(str(dest)).version() == 3
    history = DeltaTable(str(dest)).history()
    assert sorted(c["dyngen.version"] for c in history) == [0, 1, 2, 3]
    for k in range(4):
        assert delta_rows(dest, k) == as_multiset(store.load(NAME, k).to_list())


def test_a_version_in_the_mirrors_schema_is_mirrored_without_loading_datasets(
        tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    store.create(NAME, verl_rows(2))
    dest = tmp_path / "mirror"
    mirror_delta(store, NAME, dest)
    store.append(NAME, verl_rows(3, start=2))
    code = ("import sys; from dyngen.store import Store; from dyngen.mirror import "
            f"mirror_delta; done = mirror_delta(Store({str(store.root)!r}), {NAME!r}, "
            f"{str(dest)!r}); print(done.committed, 'datasets' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).parents[2])
    assert out.stdout.split() == ["(1,)", "False"]  # its import costs the command a second
    assert delta_rows(dest, 1) == as_multiset(store.load(NAME).to_list())
