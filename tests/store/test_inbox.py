"""The inbox: batch ends written once per (training run, step), read back from the store.

`store` and `open_store` (tests/store/conftest.py) run a test on a local folder,
`memory://`, S3 (moto's server) and GCS (fake-gcs-server); tests that damage files,
race threads or feed hostile input stay local.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from dyngen.errors import CorruptionError, DatasetNameError
from dyngen.store import BatchEndError, Store, gc, verify
from dyngen.store.covered import MAX_STEP, decode_run, encode_run
from dyngen.store.inbox import INLINE_ROLLOUTS_BYTES
from tests.rows import verl_rows

ROLLOUTS = [{"prompt": "What is 2 + 2?", "score": 1.0, "ground_truth": "4"},
            {"prompt": [{"role": "user", "content": "Tell me 3 * 3"}], "score": 0.0}]


def big_rollouts(n: int = 300) -> list[dict[str, Any]]:
    """Rollouts larger than an entry inlines."""
    rows = [{"prompt": f"Question {i}: " + "x" * 200, "score": i % 2} for i in range(n)]
    assert len(json.dumps(rows)) > INLINE_ROLLOUTS_BYTES
    return rows


def test_a_batch_end_is_created_once_and_a_resend_returns_the_first(
        open_store: Callable[..., Store]) -> None:
    store = open_store()
    first = store.write_batch_end("ds", "run-1", 3, {"reward/mean": 0.5}, ROLLOUTS,
                                  event_id="e-1")
    assert (first.created, first.differs, first.key) == (True, (), ("run-1", 3))
    again = open_store().write_batch_end("ds", "run-1", 3, {"reward/mean": 0.5}, ROLLOUTS,
                                         event_id="e-2")  # a resumed trainer's re-send
    assert (again.created, again.differs) == (False, ())
    assert again == first and again.event_id == "e-1"
    other = open_store().write_batch_end("ds", "run-1", 3, {"reward/mean": 0.9}, ROLLOUTS[:1])
    assert (other.created, other.differs) == (False, ("metrics", "rollouts"))
    assert other.metrics == {"reward/mean": 0.5}  # the first is kept, never overwritten
    fresh = open_store()
    assert fresh.batch_ends("ds") == [first]
    assert fresh.batch_end("ds", "run-1", 3) == first
    assert fresh.batch_end("ds", "run-1", 4) is None
    assert fresh.read_rollouts(fresh.batch_end("ds", "run-1", 3)) == ROLLOUTS


def test_runs_are_kept_apart_and_listed_by_run_then_step(
        open_store: Callable[..., Store]) -> None:
    store = open_store()
    runs = ["verl:exp-2", "trl/run 1", "実験", ".hidden", "..", "a%2F"]
    for step in (10, 2, 0):
        for run in runs:
            store.write_batch_end("ds", run, step, {"loss": step / 10})
    fresh = open_store()
    keys = [e.key for e in fresh.batch_ends("ds")]
    assert keys == sorted((r, s) for r in runs for s in (0, 2, 10))
    assert [e.key for e in fresh.pending("ds")] == keys  # no version yet: all pending
    assert fresh.batch_end("ds", "..", 2).metrics == {"loss": 0.2}


def test_rollouts_are_read_back_from_the_store_by_another_host(
        open_store: Callable[..., Store], tmp_path: Path) -> None:
    store = open_store()
    jsonl = tmp_path / "rollouts.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in ROLLOUTS), encoding="utf-8")
    large = big_rollouts()
    store.write_batch_end("ds", "run", 0, rollouts=ROLLOUTS)
    store.write_batch_end("ds", "run", 1, rollouts=large)
    store.write_batch_end("ds", "run", 2, rollouts=jsonl)
    store.write_batch_end("ds", "run", 3, rollouts=pa.Table.from_pylist(ROLLOUTS[:1]))
    store.write_batch_end("ds", "run", 4)
    jsonl.unlink()  # the trainer's file is gone: the store holds its copy
    worker = open_store()  # reads the inbox through the store's root, as a remote worker
    entries = worker.batch_ends("ds")
    assert entries[0].rollouts.inline is not None and entries[1].rollouts.path is not None
    assert entries[1].rollouts.path.startswith("_inbox/run/")
    got = [worker.read_rollouts(e) for e in entries]
    assert got == [ROLLOUTS, large, ROLLOUTS, ROLLOUTS[:1], []]
    for entry, rows in zip(entries, got, strict=True):
        lines = worker.rollouts_bytes(entry).decode().splitlines()
        assert [json.loads(line) for line in lines] == rows
        assert entry.rollouts is None or entry.rollouts.rows == len(rows)


def test_two_writers_racing_for_one_step_keep_one_entry(tmp_path: Path) -> None:
    stores = [Store(tmp_path) for _ in range(6)]
    barrier = threading.Barrier(len(stores))
    results: list[Any] = [None] * len(stores)

    def write(i: int) -> None:
        barrier.wait()
        results[i] = stores[i].write_batch_end("ds", "run", 7, {"m": float(i)},
                                               big_rollouts(200 + i))

    threads = [threading.Thread(target=write, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r.created for r in results) == 1
    winner = next(r for r in results if r.created)
    assert all(r == winner for r in results)
    assert all(r.differs == ("metrics", "rollouts") for r in results if not r.created)
    folder = tmp_path / "ds" / "_inbox" / "run"
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        ["00000000000000000007.json", winner.rollouts.path.rsplit("/", 1)[-1]])
    assert Store(tmp_path).read_rollouts(winner) == big_rollouts(200 + int(winner.metrics["m"]))


class NotJson:
    pass


HOSTILE: list[tuple[str, dict[str, Any], str]] = [
    ("nan metric", {"metrics": {"loss": math.nan}}, "metric 'loss': expected a finite number"),
    ("inf metric", {"metrics": {"loss": -math.inf}}, "found -inf"),
    ("huge metric", {"metrics": {"big": 10**400}}, "metric 'big': expected a finite number"),
    ("bool metric", {"metrics": {"ok": True}}, "expected a finite number, found bool"),
    ("text metric", {"metrics": {"loss": "0.1"}}, "found str"),
    ("metrics list", {"metrics": [1.0]}, "expected a mapping of names to numbers"),
    ("huge step", {"step": 10**30}, f"expected an integer from 0 to {MAX_STEP}"),
    ("negative step", {"step": -1}, "expected an integer from 0"),
    ("float step", {"step": 2.0}, "expected an integer >= 0, found float"),
    ("bool step", {"step": True}, "found bool"),
    ("empty run", {"run": ""}, "expected a non-empty string"),
    ("blank run", {"run": "  "}, "expected a non-empty string"),
    ("no run", {"run": None}, "found NoneType"),
    ("newline run", {"run": "a\nb"}, "control character U+000A"),
    ("long run", {"run": "r" * 300}, "expected at most 200 bytes once encoded"),
    ("set rollout", {"rollouts": [{"tags": {1, 2}}]}, "rollouts[0]: expected a JSON value"),
    ("object rollout", {"rollouts": [1, NotJson()]}, "rollouts[1]: expected a JSON value"),
    ("nan rollout", {"rollouts": [{"score": math.nan}]}, "not finite"),
    ("dict rollouts", {"rollouts": {"a": 1}}, "expected a list of JSON values"),
    ("missing file", {"rollouts": "/nonexistent/rollouts.jsonl"}, "readable JSONL file"),
    ("bad event id", {"event_id": ""}, "event_id: expected 1-200 characters"),
]


@pytest.mark.parametrize(("case", "given", "message"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_input_is_refused_saying_what_was_expected(
        tmp_path: Path, case: str, given: dict[str, Any], message: str) -> None:
    store = Store(tmp_path)
    args = {"run": "run", "step": 1, **given}
    with pytest.raises(BatchEndError, match="expected") as caught:
        store.write_batch_end("ds", args.pop("run"), args.pop("step"), **args)
    assert message in str(caught.value), case
    assert isinstance(caught.value, ValueError)
    assert not (tmp_path / "ds").exists()  # checked before anything is written


def test_a_rollouts_file_that_is_not_jsonl_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"score": 1}\nnot json\n', encoding="utf-8")
    with pytest.raises(BatchEndError, match="line 2: expected one JSON value per line"):
        Store(tmp_path / "root").write_batch_end("ds", "run", 1, rollouts=bad)
    with pytest.raises(DatasetNameError):
        Store(tmp_path / "root").write_batch_end("../ds", "run", 1)


@pytest.mark.parametrize("run", ["../../_versions", "/etc/passwd", ".", "..", "a/../../b",
                                 "%2E%2E", "C:\\x", "run\u2028x", "\U0001f600"])
def test_run_names_are_encoded_into_one_folder_inside_the_inbox(tmp_path: Path,
                                                                run: str) -> None:
    store = Store(tmp_path)
    store.write_batch_end("ds", run, 5, {"m": 1.0})
    folders = list((tmp_path / "ds" / "_inbox").iterdir())
    assert len(folders) == 1 and decode_run(folders[0].name) == run
    assert folders[0].name == encode_run(run) and not folders[0].name.startswith(".")
    assert sorted(p.relative_to(tmp_path).parts[:2] for p in tmp_path.rglob("*.json")) == [
        ("ds", "_inbox")]
    assert [e.key for e in Store(tmp_path).batch_ends("ds")] == [(run, 5)]


def test_a_damaged_entry_is_reported_by_name(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.write_batch_end("ds", "run", 1, rollouts=big_rollouts())
    entry = tmp_path / "ds" / "_inbox" / "run" / f"{1:020d}.json"
    data = json.loads(entry.read_text())
    blob = tmp_path / "ds" / data["rollouts"]["path"]
    blob.write_bytes(blob.read_bytes()[:-10])
    with pytest.raises(CorruptionError, match="does not match its hash"):
        Store(tmp_path).read_rollouts(Store(tmp_path).batch_end("ds", "run", 1))
    for damage in ({**data, "step": 2}, {**data, "rollouts": {**data["rollouts"],
                                                             "path": "../data/x.arrow"}}):
        entry.unlink()
        entry.write_text(json.dumps(damage))
        with pytest.raises(CorruptionError, match=f"inbox entry {entry}"):
            Store(tmp_path).batch_ends("ds")
    entry.unlink()
    entry.write_text("{")
    with pytest.raises(CorruptionError, match="never changed"):
        Store(tmp_path).pending("ds")


def test_gc_removes_rollouts_no_entry_names(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.create("ds", verl_rows(1))
    kept = store.write_batch_end("ds", "run", 1, rollouts=big_rollouts())
    folder = tmp_path / "ds" / "_inbox" / "run"
    # A writer that died between its rollouts file and its entry, and one mid-write.
    (folder / f"{2:020d}.{'a' * 32}.jsonl").write_text("{}\n")
    (folder / ".tmp-123456789abc-00000000000000000003.json").write_text("{")
    assert gc(store, "ds") == []  # younger than the grace period: a writer may be at work
    assert sorted(gc(store, "ds", grace_seconds=0)) == [
        "_inbox/run/.tmp-123456789abc-00000000000000000003.json",
        f"_inbox/run/{2:020d}.{'a' * 32}.jsonl"]
    assert Store(tmp_path).read_rollouts(kept) == big_rollouts()
    assert gc(store, "ds", grace_seconds=0, dry_run=True) == []
    assert verify(store, "ds") == []
