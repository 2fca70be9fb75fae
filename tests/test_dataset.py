"""DyngenDataset over real store files: reading, refreshing without copies, asking for rounds."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

import dyngen.trainers.events as events
from dyngen.errors import ConfigError, DatasetNotFoundError
from dyngen.store import Store
from dyngen.trainers.dataset import DyngenDataset
from dyngen.trainers.outbox import Outbox
from tests.rows import verl_rows
from tests.support import UNUSED_API


@pytest.fixture
def store(tmp_path: Path) -> Store:
    store = Store(tmp_path / "store")
    store.create("ds", verl_rows(4))
    return store


def shard_files(ds: DyngenDataset) -> list[str]:
    return [Path(f["filename"]).name for f in ds.data.cache_files]


def test_rows_are_the_stored_rows_with_provenance(store: Store) -> None:
    ds = DyngenDataset(store.root, "ds")
    assert (len(ds), ds.version) == (4, 0)
    row = ds[2]
    assert row["prompt"][1] == {"role": "user", "content": "What is 2 + 2?"}
    assert row["reward_model"] == {"style": "rule", "ground_truth": "4"}
    assert row["extra_info"]["index"] == 2
    assert (row["_dyngen_version"], row["_dyngen_generator"]) == (0, "import")
    assert [ds[i]["extra_info"]["index"] for i in range(len(ds))] == [0, 1, 2, 3]


def test_missing_dataset_and_bad_arguments_fail_at_construction(store: Store) -> None:
    with pytest.raises(DatasetNotFoundError, match="nope"):
        DyngenDataset(store.root, "nope")
    with pytest.raises(ConfigError, match="mode: expected one of emit, inline, found 'sync'"):
        DyngenDataset(store.root, "ds", mode="sync")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="every_n_batches: expected an integer >= 1, found 0"):
        DyngenDataset(store.root, "ds", every_n_batches=0)
    with pytest.raises(ConfigError, match="generate_on_start: expected true or false, found"):
        DyngenDataset(store.root, "ds", generate_on_start="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="start_timeout: expected seconds > 0, found 0"):
        DyngenDataset(store.root, "ds", generate_on_start=True, start_timeout=0)


def test_a_start_round_that_cannot_be_sent_is_not_waited_for(
        store: Store, no_server: None, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="dyngen")
    started = time.monotonic()
    ds = DyngenDataset(store.root, "ds", generate_on_start=True, start_timeout=600)
    assert time.monotonic() - started < events.MAX_EMIT_SECONDS
    assert ds.version == 0 and ds.start_round is not None  # queued in the outbox
    assert "the start round of 'ds' was queued, not sent; training starts on version 0" in \
        caplog.text


def test_refresh_maps_a_version_committed_by_another_handle_without_copying(store: Store) -> None:
    ds = DyngenDataset(store.root, "ds")
    before = shard_files(ds)
    assert ds.refresh() is False

    other = Store(store.root)  # e.g. the Prefect worker running the round
    other.append("ds", verl_rows(2, start=100), generator="gen", round_id="r1")
    assert len(ds) == 4  # nothing changes until asked
    assert ds.refresh() is True
    assert (len(ds), ds.version) == (6, 1)
    assert ds[5]["extra_info"]["index"] == 101
    assert (ds[5]["_dyngen_version"], ds[5]["_dyngen_generator"]) == (1, "gen")
    # The old rows are the same memory-mapped shard file, plus one new shard.
    after = shard_files(ds)
    assert after[: len(before)] == before and len(after) == len(before) + 1
    assert ds.refresh() is False


def test_rows_added_since_tells_appends_from_restores(store: Store) -> None:
    ds = DyngenDataset(store.root, "ds")
    store.append("ds", verl_rows(3, start=100))
    ds.refresh()
    added = ds.rows_added_since(0)
    assert added is not None
    assert [e["index"] for e in added["extra_info"]] == [100, 101, 102]
    assert len(ds.rows_added_since(1)) == 0

    store.restore("ds", 0)
    assert ds.refresh() is True
    assert (len(ds), ds.version) == (4, 2)
    assert ds.rows_added_since(1) is None  # v2 is v0 again, not v1 plus rows


def test_emit_with_no_server_records_the_batch_ends_returns_quickly_and_warns_once(
        store: Store, no_server: None, caplog: pytest.LogCaptureFixture) -> None:
    ds = DyngenDataset(store.root, "ds", run="job")
    caplog.set_level(logging.DEBUG, logger="dyngen.trainers.events")
    start = time.monotonic()
    results = [ds.on_batch_end(metrics={"score/mean": 0.5}) for _ in range(3)]
    elapsed = time.monotonic() - start
    # The batch ends are in the store, for the next round; their wake-ups are not kept.
    assert results == [e.event_id for e in Store(store.root).pending("ds")]
    assert len(set(results)) == 3 and Outbox().pending(UNUSED_API) == []
    assert elapsed < 3 * events.MAX_EMIT_SECONDS
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "'ds' step 1 was not sent" in warnings[0].getMessage()
    assert UNUSED_API in warnings[0].getMessage()
    assert "the batch end is in the store's inbox" in warnings[0].getMessage()
    assert ds.batches == 3


def test_every_n_batches_and_metrics(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[tuple[str, int, object]] = []

    def fake_emit(dataset: str, step: int, metrics: object = None, rollouts: object = None,
                  **_: object) -> str:
        sent.append((dataset, step, metrics))
        return f"evt-{step}"

    monkeypatch.setattr("dyngen.trainers.dataset.emit_batch_end", fake_emit)
    batches = [{"score": s} for s in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7)]
    ds = DyngenDataset(store.root, "ds", every_n_batches=3,
                       metrics_fn=lambda b: {"score/mean": b["score"]})
    results = [ds.on_batch_end(b) for b in batches]
    assert results == [None, None, "evt-3", None, None, "evt-6", None]
    assert sent == [("ds", 3, {"score/mean": 0.3}), ("ds", 6, {"score/mean": 0.6})]

    sent.clear()
    ds.on_batch_end(batches[0], step=120, metrics={"acc/mean": 1.0})
    ds.on_batch_end(batches[0], step=121)
    assert sent == [("ds", 121, {"score/mean": 0.1})]  # batch 9 of every 3: explicit step


def test_a_failing_metrics_fn_does_not_stop_training(
        store: Store, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    sent: list[object] = []
    monkeypatch.setattr("dyngen.trainers.dataset.emit_batch_end",
                        lambda dataset, step, metrics=None, rollouts=None, **_:
                        sent.append(metrics))

    def broken(batch: object) -> dict[str, float]:
        raise KeyError("score")

    ds = DyngenDataset(store.root, "ds", metrics_fn=broken)
    ds.on_batch_end({"x": 1})
    assert sent == [None]
    assert "metrics_fn failed at step 1" in caplog.text


def test_on_batch_end_maps_versions_committed_meanwhile(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("dyngen.trainers.dataset.emit_batch_end", lambda *a, **k: "evt")
    ds = DyngenDataset(store.root, "ds", every_n_batches=100)
    store.append("ds", verl_rows(1, start=100))  # a round a server ran for an earlier batch
    assert ds.on_batch_end() is None  # no round asked for at batch 1 of every 100 ...
    assert (len(ds), ds.version) == (5, 1)  # ... but the committed version is served


def test_refresh_opens_only_shards_it_has_not_opened(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    from datasets.table import MemoryMappedTable

    opened: list[str] = []
    real = MemoryMappedTable.from_file.__func__  # type: ignore[attr-defined]

    def counting(cls, filename, *args, **kwargs):
        opened.append(Path(filename).name)
        return real(cls, filename, *args, **kwargs)

    monkeypatch.setattr(MemoryMappedTable, "from_file", classmethod(counting))
    for r in range(20):
        store.append("ds", verl_rows(1, start=100 + r))
    ds = DyngenDataset(store.root, "ds")
    assert len(opened) == 21 and len(ds) == 24
    other = Store(store.root)
    for r in range(3):
        other.append("ds", verl_rows(1, start=200 + r))
    opened.clear()
    assert ds.refresh() is True
    assert len(opened) == 3  # the three new shards, not the 24 of the dataset
    assert [ds[i]["extra_info"]["index"] for i in range(24, 27)] == [200, 201, 202]


def test_rows_added_since_sees_through_compaction(store: Store) -> None:
    ds = DyngenDataset(store.root, "ds")
    for r in range(6):
        store.append("ds", verl_rows(1, start=100 + r))
    store.compact("ds", full=True)
    store.append("ds", verl_rows(1, start=300))
    ds.refresh()
    added = ds.rows_added_since(0)
    assert added is not None
    assert [e["index"] for e in added["extra_info"]] == [100, 101, 102, 103, 104, 105, 300]
    store.restore("ds", 0)
    ds.refresh()
    assert ds.rows_added_since(1) is None
