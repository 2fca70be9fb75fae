"""Retention: vacuum expires old versions, deletes only files no kept version names."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from dyngen.errors import ConfigError, VersionVacuumedError
from dyngen.store import CompactionPolicy, Store, gc, verify
from dyngen.store import retention as retention_module
from tests.rows import verl_rows

REJECT = [{"reason": "duplicate", "detail": "seen", "row": "{}"}]


def indices(ds) -> list[int]:
    return [e["index"] for e in ds["extra_info"]]


def compacted(tmp_path: Path) -> Store:
    """Versions 0..8 of small shards (one quarantine shard each), then a full compaction (9)."""
    store = Store(tmp_path)
    store.create("ds", verl_rows(2))
    for r in range(8):
        store.append("ds", verl_rows(1, start=2 + r), rejected=REJECT)
    store.compact("ds", full=True)
    return store


def files(store: Store) -> set[str]:
    base = store.dataset_dir("ds")
    return {f"{sub}/{p.name}" for sub in ("data", "rejected") for p in (base / sub).iterdir()}


def test_vacuum_expires_old_versions_and_deletes_only_what_no_kept_version_names(
        tmp_path: Path) -> None:
    store = compacted(tmp_path)
    kept = store.load("ds", 9).to_list()
    rejected = store.load_rejected("ds").to_list()
    before = files(store)
    result = store.vacuum("ds", keep_versions=1, grace_seconds=0)
    assert result.record is not None and result.record.operation == "vacuum"
    # The newest version (9) is kept, and the vacuum's own version (10) has its rows.
    assert (result.record.version, result.expired_before) == (10, 9)
    removed = set(result.removed)
    assert removed and removed < before and all(f.startswith(("data/", "rejected/"))
                                                for f in removed)
    assert files(store) == before - removed
    fresh = Store(tmp_path)
    assert fresh.load("ds", 9).to_list() == kept == fresh.load("ds").to_list()
    assert fresh.load_rejected("ds").to_list() == rejected
    with pytest.raises(VersionVacuumedError) as err:
        fresh.load("ds", 3)
    message = str(err.value)
    for part in ("version 3", "removed by retention", "dyngen vacuum --keep-versions 1",
                 "version 10", "oldest version that loads is 9", "dyngen log ds"):
        assert part in message, message
    assert [r.version for r in fresh.history("ds")] == list(range(11))  # records stay
    assert fresh.record("ds", 3).rows == 5
    assert verify(store, "ds") == []
    assert gc(store, "ds", grace_seconds=0) == []


def test_an_expired_version_cannot_be_restored_or_deduplicated_against(tmp_path: Path) -> None:
    store = compacted(tmp_path)
    store.vacuum("ds", keep_versions=1, grace_seconds=0)
    with pytest.raises(VersionVacuumedError, match="cannot restore version 2"):
        store.restore("ds", 2)
    import numpy as np

    with pytest.raises(VersionVacuumedError):
        store.contains_prompts("ds", np.array([1], dtype="<u8"), version=2)
    assert store.restore("ds", 9).rows == 10  # a kept one still can


def test_a_second_vacuum_with_the_same_rule_changes_nothing(tmp_path: Path) -> None:
    store = compacted(tmp_path)
    first = store.vacuum("ds", keep_versions=2, grace_seconds=0)
    assert first.expired_before == 8  # keeps 8 and 9; the vacuum itself is version 10
    for rule in (2, 3):  # the vacuum's own version does not count as one to keep
        again = store.vacuum("ds", keep_versions=rule, grace_seconds=0)
        assert (again.record, again.removed) == (None, [])  # nothing newly expired
    assert store.head_version("ds") == 10


def test_dry_run_lists_and_deletes_nothing(tmp_path: Path) -> None:
    store = compacted(tmp_path)
    before = files(store)
    result = store.vacuum("ds", keep_versions=1, grace_seconds=0, dry_run=True)
    assert result.record is None and result.removed and files(store) == before
    assert store.head_version("ds") == 9


def test_a_version_a_round_may_still_read_keeps_its_files_for_the_grace_period(
        tmp_path: Path) -> None:
    import numpy as np

    from dyngen.store.keys import prompt_keys

    store = compacted(tmp_path)
    probe = prompt_keys([verl_rows(1, start=3)[0]["prompt"]])
    result = store.vacuum("ds", keep_versions=1)  # default grace: an hour
    assert result.expired_before == 9 and result.removed == []  # expired, files kept
    with pytest.raises(VersionVacuumedError):
        Store(tmp_path).load("ds", 2)
    # A round that loaded version 2 before the vacuum still finishes its dedup.
    assert Store(tmp_path).contains_prompts("ds", probe, version=2).tolist() == [True]
    assert store.vacuum("ds", keep_versions=1, grace_seconds=0).removed  # once it has passed
    with pytest.raises(VersionVacuumedError):
        Store(tmp_path).contains_prompts("ds", probe, version=2)
    assert np.array_equal(Store(tmp_path).contains_prompts("ds", probe), [True])


def test_keep_days_keeps_what_was_the_head_within_the_window(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = compacted(tmp_path)
    old = time.time() - 3 * 86400
    for path in (store.dataset_dir("ds") / sub for sub in ("data", "rejected")):
        for file in path.iterdir():
            os.utime(file, (old, old))
    later = time.time() + 2 * 86400  # two days on, nothing committed meanwhile
    monkeypatch.setattr(retention_module.time, "time", lambda: later)
    assert store.vacuum("ds", keep_days=7).expired_before == 0
    result = store.vacuum("ds", keep_days=1)
    assert result.expired_before == 9  # 9 was still the head a day ago: kept
    assert store.load("ds", 9).num_rows == 10
    with pytest.raises(VersionVacuumedError, match="--keep-days 1"):
        Store(tmp_path).load("ds", 8)


def test_a_round_in_flight_keeps_its_shard(tmp_path: Path) -> None:
    store = compacted(tmp_path)
    pending = store.prepare_append("ds", verl_rows(1, start=50))
    store.vacuum("ds", keep_versions=1, grace_seconds=60)
    assert Store(tmp_path).commit_with_rebase(pending).rows == 11
    assert indices(Store(tmp_path).load("ds"))[-1] == 50
    assert verify(store, "ds") == []


def test_vacuum_needs_a_rule(tmp_path: Path) -> None:
    store = compacted(tmp_path)
    with pytest.raises(ConfigError, match="--keep-versions N or --keep-days D"):
        store.vacuum("ds")
    with pytest.raises(ConfigError, match="--keep-versions expects an integer >= 1"):
        store.vacuum("ds", keep_versions=0)


def test_compaction_then_vacuum_bounds_the_files_of_a_long_history(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.create("ds", verl_rows(1))
    for r in range(40):
        store.append("ds", verl_rows(1, start=1 + r))
        store.compact("ds", CompactionPolicy(max_small_shards=4, fan_in=4))
    store.vacuum("ds", keep_versions=1, grace_seconds=0)
    head = store.state("ds")
    assert len(list((store.dataset_dir("ds") / "data").glob("*.arrow"))) == len(head.shards)
    assert len(head.shards) <= 8
    assert indices(Store(tmp_path).load("ds")) == list(range(41))
    assert verify(store, "ds") == []
