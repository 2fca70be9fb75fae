"""A restore's state: the restored version's shards plus the log's running state (retention,
generators), the same in the writer and in every fresh `Store` (issue #30, defect 1)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from dyngen.errors import VersionVacuumedError
from dyngen.store import Store, gc, verify
from tests.rows import verl_rows


def restored_after_vacuum(store: Store) -> None:
    """v0 create, v1 append, v2 full compaction, v3 vacuum (v0, v1 expired), v4 restore of v2."""
    store.create("ds", verl_rows(1))
    store.append("ds", verl_rows(1, start=1), compact=False,
                 lineage={"generator": {"class": "Gen"}})
    store.compact("ds", full=True)
    store.vacuum("ds", keep_versions=1, grace_seconds=0)
    store.restore("ds", 2)


def test_a_fresh_store_keeps_retention_after_a_restore(open_store: Callable[..., Store]) -> None:
    writer = open_store()
    restored_after_vacuum(writer)
    fresh = open_store()
    assert fresh.state("ds").retention is not None
    assert fresh.state("ds").expired_before == 2
    assert fresh.state("ds") == writer.state("ds")
    assert verify(fresh, "ds") == []
    with pytest.raises(VersionVacuumedError, match="cannot restore version 0"):
        fresh.restore("ds", 0)
    assert open_store().head_version("ds") == 4
    assert [e["index"] for e in open_store().load("ds")["extra_info"]] == [0, 1]
    with pytest.raises(VersionVacuumedError):
        open_store().load("ds", 1)
    assert gc(fresh, "ds", grace_seconds=0) == []


def test_a_fresh_store_knows_each_generators_newest_version_after_a_restore(
        open_store: Callable[..., Store]) -> None:
    writer = open_store()
    restored_after_vacuum(writer)
    assert writer.newest_by_generator("ds", "Gen").version == 1
    assert open_store().newest_by_generator("ds", "Gen").version == 1


def test_rerunning_the_same_vacuum_after_a_restore_commits_nothing(
        open_store: Callable[..., Store]) -> None:
    writer = open_store()
    restored_after_vacuum(writer)
    # The newest two versions that are not vacuums are v4 and v2: v2 is already the oldest
    # kept, so this rule expires nothing new.
    assert writer.vacuum("ds", keep_versions=2, grace_seconds=0).record is None
    assert open_store().vacuum("ds", keep_versions=2, grace_seconds=0).record is None
    assert open_store().head_version("ds") == 4


def test_a_fresh_writers_checkpoint_after_a_restore_carries_retention(
        open_store: Callable[..., Store]) -> None:
    writer = open_store(checkpoint_interval=5)
    restored_after_vacuum(writer)
    fresh = open_store(checkpoint_interval=5)
    fresh.append("ds", verl_rows(1, start=2), compact=False)  # v5: checkpointed
    assert fresh.log("ds").read_checkpoint(5).retention is not None
    assert verify(open_store(), "ds") == []
    assert open_store().state("ds") == fresh.state("ds")


def test_an_expired_version_whose_files_remain_does_not_load_after_a_restore(
        open_store: Callable[..., Store]) -> None:
    writer = open_store()
    writer.create("ds", verl_rows(1))
    writer.append("ds", verl_rows(1, start=1), compact=False)
    writer.vacuum("ds", keep_versions=1)  # the default grace period keeps v0's files
    writer.restore("ds", 1)
    with pytest.raises(VersionVacuumedError, match="version 0 of dataset 'ds' was removed"):
        open_store().load("ds", 0)


def test_over_a_damaged_record_a_restore_reads_the_same_in_the_writer_and_a_fresh_store(
        tmp_path: Path) -> None:
    writer = Store(tmp_path)
    writer.create("ds", verl_rows(2))
    writer.append("ds", verl_rows(1, start=2), compact=False)  # v1
    writer.append("ds", verl_rows(1, start=3), compact=False)  # v2, then damaged
    (tmp_path / writer.log("ds").record_rel(2)).write_text("{not json")
    restored = Store(tmp_path).restore("ds", 1)  # recovers over the damage: v3
    writer.append("ds", verl_rows(1, start=4), compact=False)  # v4, on the writer's state
    fresh = Store(tmp_path)
    assert restored.version == 3
    assert fresh.state("ds") == writer.state("ds")
    assert [e["index"] for e in fresh.load("ds")["extra_info"]] == [0, 1, 2, 4]
