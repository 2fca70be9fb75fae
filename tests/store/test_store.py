"""Behaviour of the versioned store: versions, reads, conflicts, idempotency.

`store` and `open_store` (tests/store/conftest.py) run each test on a local folder,
`memory://` and S3 (moto's server); tests that damage files or race processes stay local.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dyngen.errors import (
    CommitConflictError,
    CorruptionError,
    DatasetExistsError,
    DatasetNotFoundError,
    SchemaMismatchError,
    VersionNotFoundError,
)
from dyngen.store import Store, gc, verify
from tests.rows import verl_rows

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def local_store(tmp_path: Path) -> Store:
    return Store(tmp_path / "root")


def indices(ds) -> list[int]:
    return [e["index"] for e in ds["extra_info"]]


def test_create_append_load_and_history(store: Store) -> None:
    v0 = store.create("ds", verl_rows(3))
    v1 = store.append("ds", verl_rows(2, start=3), generator="Gen", round_id="r1")
    assert (v0.version, v0.parent, v0.operation) == (0, None, "create")
    assert (v1.version, v1.parent, v1.operation, v1.rows) == (1, 0, "append", 5)
    ds = store.load("ds")
    assert indices(ds) == [0, 1, 2, 3, 4]
    assert ds[4]["prompt"][1] == {"role": "user", "content": "What is 4 + 4?"}
    assert ds["_dyngen_version"] == [0, 0, 0, 1, 1]
    assert ds["_dyngen_generator"] == ["import"] * 3 + ["Gen"] * 2
    assert ds["_dyngen_round"][3:] == ["r1", "r1"]
    assert [r.version for r in store.history("ds")] == [0, 1]
    assert store.head("ds") == v1
    assert verify(store, "ds") == []


def test_time_travel_reads_old_version_after_appends(store: Store) -> None:
    store.create("ds", verl_rows(3))
    store.append("ds", verl_rows(2, start=3))
    store.append("ds", verl_rows(1, start=5))
    assert indices(store.load("ds", 0)) == [0, 1, 2]
    assert indices(store.load("ds", 1)) == [0, 1, 2, 3, 4]
    with pytest.raises(VersionNotFoundError, match="no version 7; versions are 0..2"):
        store.load("ds", 7)


def test_load_memory_maps_shards(store: Store) -> None:
    store.create("ds", verl_rows(50))
    store.append("ds", verl_rows(50, start=50))
    ds = store.load("ds")
    assert len(ds.cache_files) == 2
    # A remote store's shards are mapped from the local cache, a local store's in place.
    folder = store.root if isinstance(store.root, Path) else store.backend.cache.folder
    assert all(f["filename"].startswith(str(folder)) for f in ds.cache_files)


def test_restore_commits_a_new_version_equal_to_an_old_one(store: Store) -> None:
    store.create("ds", verl_rows(3))
    store.append("ds", verl_rows(2, start=3))
    rec = store.restore("ds", 0)
    assert (rec.version, rec.parent, rec.operation) == (2, 1, "restore")
    assert rec.lineage == {"restored_from": 0}
    assert store.load("ds").to_list() == store.load("ds", 0).to_list()
    assert indices(store.load("ds", 1)) == [0, 1, 2, 3, 4]  # history is untouched
    assert verify(store, "ds") == []


def test_empty_append_commits_a_version_with_the_same_rows(store: Store) -> None:
    store.create("ds", verl_rows(2))
    rejected = [{"reason": "duplicate", "detail": "same prompt as row 0", "row": "{}"}]
    rec = store.append("ds", [], rejected=rejected)
    assert (rec.version, rec.rows) == (1, 2)
    quarantined = store.load_rejected("ds")
    assert quarantined["reason"] == ["duplicate"]
    assert store.load_rejected("ds", 0).num_rows == 0


def test_missing_dataset_and_existing_dataset_errors(store: Store) -> None:
    with pytest.raises(DatasetNotFoundError, match="dyngen import nope"):
        store.load("nope")
    store.create("ds", verl_rows(1))
    with pytest.raises(DatasetExistsError, match="already exists"):
        store.create("ds", verl_rows(1))


def test_shard_without_commit_leaves_head_unchanged_and_gc_removes_it(store: Store) -> None:
    store.create("ds", verl_rows(2))
    pending = store.prepare_append("ds", verl_rows(2, start=2))
    orphan = f"ds/{pending.new_shards[0].path}"
    assert store.backend.exists(orphan)
    assert store.head("ds").version == 0
    assert indices(store.load("ds")) == [0, 1]
    assert gc(store, "ds") == []  # inside the grace period: a round may still be in flight
    assert gc(store, "ds", grace_seconds=0) == sorted(pending.new_shards[0].files)
    assert not store.backend.exists(orphan)
    assert verify(store, "ds") == []


def test_two_writers_on_one_parent_one_conflicts_then_rebases(open_store) -> None:
    a, b = open_store(), open_store()
    a.create("ds", verl_rows(1))
    pa_ = a.prepare_append("ds", verl_rows(1, start=1))
    pb = b.prepare_append("ds", verl_rows(1, start=2))
    assert a.commit(pa_).version == 1
    with pytest.raises(CommitConflictError, match="expected parent 0, found 1"):
        b.commit(pb)
    rebased = b.rebase(pb)
    assert rebased.parent == 1
    rec = b.commit(rebased)
    assert (rec.version, rec.parent) == (2, 1)
    ds = a.load("ds")
    assert indices(ds) == [0, 1, 2]
    assert ds["_dyngen_version"] == [0, 1, 2]  # the rebased rows carry their real version
    assert gc(a, "ds", grace_seconds=0) == []  # the pre-rebase shard was removed at once
    assert verify(a, "ds") == []


_WRITER = """
import sys
from dyngen.store import Store
from tests.rows import verl_row
root, proc, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
store = Store(root)
for i in range(n):
    store.append("ds", [verl_row(1000 * proc + i, source=f"p{proc}")])
"""


def test_four_processes_times_ten_appends_are_contiguous_and_exact(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.create("ds", verl_rows(1))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path), str(p), "10"],
                         env=env, cwd=REPO, stderr=subprocess.PIPE, text=True)
        for p in range(1, 5)
    ]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    history = store.history("ds")
    assert [r.version for r in history] == list(range(41))
    assert all(r.parent == r.version - 1 for r in history[1:])
    got = sorted(indices(store.load("ds")))
    expected = sorted([0] + [1000 * p + i for p in range(1, 5) for i in range(10)])
    assert got == expected  # every appended row exactly once
    assert verify(store, "ds") == []
    assert gc(store, "ds", grace_seconds=0) == []


def test_same_idempotency_key_twice_commits_once(store: Store) -> None:
    store.create("ds", verl_rows(1))
    first = store.append("ds", verl_rows(1, start=1), idempotency_key="event-42")
    again = store.append("ds", verl_rows(1, start=1), idempotency_key="event-42")
    assert again == first
    assert store.head("ds").version == 1
    assert indices(store.load("ds")) == [0, 1]
    assert gc(store, "ds", grace_seconds=0) == []  # the duplicate's shard was not left behind


def test_idempotency_key_is_found_after_a_conflict(open_store) -> None:
    a, b = open_store(), open_store()
    a.create("ds", verl_rows(1))
    pa_ = a.prepare_append("ds", verl_rows(1, start=1), idempotency_key="k")
    pb = b.prepare_append("ds", verl_rows(1, start=1), idempotency_key="k")
    a.commit(pa_)
    assert b.commit_with_rebase(pb).version == 1
    assert a.head("ds").version == 1


def test_rows_with_unknown_fields_are_refused_and_nothing_is_left(store: Store) -> None:
    store.create("ds", verl_rows(1))
    bad = verl_rows(1, start=1)
    bad[0]["reward_model"]["surprise"] = 1  # only extra_info may gain fields
    with pytest.raises(SchemaMismatchError, match=r"reward_model\.surprise"):
        store.append("ds", bad)
    bad2 = verl_rows(1, start=1)
    bad2[0]["novel_column"] = "x"
    with pytest.raises(SchemaMismatchError, match="novel_column"):
        store.append("ds", bad2)
    assert store.head("ds").version == 0
    assert gc(store, "ds", grace_seconds=0) == []


def test_rows_missing_optional_fields_are_filled_with_null(store: Store) -> None:
    store.create("ds", verl_rows(1))
    row = verl_rows(1, start=1)[0]
    del row["extra_info"]["split"]
    store.append("ds", [row])
    assert store.load("ds")[1]["extra_info"] == {"index": 1, "split": None}


def test_contains_prompts_finds_stored_prompts_by_normalised_key(store: Store) -> None:
    import numpy as np

    from dyngen.store.keys import prompt_keys

    store.create("ds", verl_rows(3))
    store.append("ds", verl_rows(2, start=3))
    same_but_spaced = [{"role": " System", "content": "Solve   the problem. "},
                       {"role": "user", "content": "What is 4 +  4?"}]
    probes = [verl_rows(1, start=0)[0]["prompt"], same_but_spaced,
              verl_rows(1, start=9)[0]["prompt"]]
    found = store.contains_prompts("ds", prompt_keys(probes))
    assert found.tolist() == [True, True, False]
    assert store.contains_prompts("ds", prompt_keys(probes), version=0).tolist() == [
        True, False, False]
    assert store.contains_prompts("ds", np.array([], dtype="<u8")).tolist() == []


def test_a_failed_quarantine_write_leaves_no_data_shard_behind(store: Store) -> None:
    store.create("ds", verl_rows(1))
    with pytest.raises(SchemaMismatchError, match="rejected rows need a 'reason' column"):
        store.prepare_append("ds", verl_rows(2, start=1), rejected=[{"row": "{}"}])
    assert store.head("ds").version == 0
    assert sorted(store.backend.list("ds/data")) == sorted(
        f.split("/")[1] for s in store.head("ds").shards for f in s.files)


def test_idempotency_lookup_and_recent_history_read_few_records(open_store) -> None:
    store = open_store()
    store.create("ds", verl_rows(1))
    for v in range(1, 6):
        store.append("ds", verl_rows(1, start=v), idempotency_key=f"event:{v}")
    fresh = open_store()
    assert fresh.find_idempotency_key("ds", "event:2").version == 2
    assert fresh.find_idempotency_key("ds", "event:9") is None
    assert sorted(v for _, v in fresh._records) == [2]  # the others were not parsed
    assert [r.version for r in fresh.history("ds", newest=2)] == [4, 5]
    assert [r.version for r in fresh.history("ds")] == [0, 1, 2, 3, 4, 5]


def test_idempotency_lookup_still_refuses_a_truncated_record(local_store: Store) -> None:
    store = local_store
    store.create("ds", verl_rows(1))
    store.append("ds", verl_rows(1, start=1), idempotency_key="event:1")
    store.append("ds", verl_rows(1, start=2))
    path = store.dataset_dir("ds") / "_versions" / f"{1:020d}.json"
    path.write_text(path.read_text()[:40])
    with pytest.raises(CorruptionError, match="not valid JSON"):
        Store(store.root).find_idempotency_key("ds", "event:1")
