"""`Store.append` compacts as a round does, so a loop of appends keeps its head small."""

from __future__ import annotations

import inspect
import logging
from pathlib import Path

import pytest

from dyngen.errors import ConfigError
from dyngen.store import CompactionPolicy, Store, verify
from tests.rows import verl_rows

SMALL = CompactionPolicy(max_small_shards=4, fan_in=4)


def indices(ds) -> list[int]:
    return [e["index"] for e in ds["extra_info"]]


def newest_checkpoint_shards(store: Store) -> int:
    state = store.log("ds").newest_checkpoint(store.head_version("ds") or 0)
    assert state is not None
    return len(state.shards)


def test_a_loop_of_appends_keeps_the_head_and_its_checkpoints_small(tmp_path: Path) -> None:
    kept = Store(tmp_path / "default", checkpoint_interval=10)
    plain = Store(tmp_path / "plain", checkpoint_interval=10)
    for store in (kept, plain):
        store.create("ds", verl_rows(1))
    appended = []
    for i in range(1, 61):  # past the default policy's 50 small shards
        appended.append(kept.append("ds", verl_rows(1, start=i)))
        plain.append("ds", verl_rows(1, start=i), compact=False)

    assert len(plain.head("ds").shards) == 61
    assert len(kept.head("ds").shards) <= 50
    # A checkpoint lists the head's shards: it stops growing with the number of appends.
    assert newest_checkpoint_shards(plain) == 61
    assert newest_checkpoint_shards(kept) <= 50
    history = kept.history("ds")
    assert {r.operation for r in history} == {"create", "append", "compact"}
    # Time travel is untouched: each append's version still loads exactly its rows.
    assert [r.operation for r in appended] == ["append"] * 60
    for record in appended[::7] + appended[-1:]:
        assert indices(kept.load("ds", version=record.version)) == list(range(record.rows))
    assert indices(kept.load("ds")) == list(range(61))
    assert verify(kept, "ds") == []


def test_append_takes_a_policy_of_its_own_or_none(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.create("ds", verl_rows(1))
    for i in range(1, 4):
        store.append("ds", verl_rows(1, start=i), compact=SMALL)
    assert len(store.head("ds").shards) == 4  # not yet more than 4 small shards
    assert store.append("ds", verl_rows(1, start=9), compact=False).compactions == ()
    record = store.append("ds", verl_rows(1, start=4), compact=SMALL)
    assert (record.version, record.operation) == (5, "append")
    assert record.compactions == (6,)  # the caller learns what the compaction committed
    head = store.head("ds")
    assert (head.version, head.operation, len(head.shards)) == (6, "compact", 3)
    assert record == store.record("ds", 5)
    assert indices(store.load("ds")) == [0, 1, 2, 3, 9, 4]
    with pytest.raises(ConfigError, match="compact expects True, False or a CompactionPolicy, "
                                          "found 'yes'"):
        store.append("ds", verl_rows(1, start=5), compact="yes")  # type: ignore[arg-type]
    assert store.head_version("ds") == 6


def test_appends_keyword_arguments_are_in_its_signature_and_docstring() -> None:
    params = inspect.signature(Store.append).parameters
    for name in ("idempotency_key", "rejected", "lineage", "compact"):
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY
        assert f"`{name}`" in (Store.append.__doc__ or "")
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    assert "`compactions`" in (Store.append.__doc__ or "")


def test_a_compaction_that_fails_after_an_append_only_warns(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = Store(tmp_path)
    store.create("ds", verl_rows(1))
    for i in range(1, 4):
        store.append("ds", verl_rows(1, start=i), compact=False)
    first = store.head("ds").shards[0]
    path = Path(store.shard_path("ds", first))
    path.write_bytes(path.read_bytes()[:-8])  # damaged: compaction refuses to rewrite it
    with caplog.at_level(logging.WARNING, logger="dyngen.store.store"):
        record = store.append("ds", verl_rows(1, start=4), compact=SMALL)
    assert store.head_version("ds") == record.version == 4
    assert "compacting ds after appending version 4 failed (the version is committed)" \
        in caplog.text
