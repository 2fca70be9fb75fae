"""SIGKILL inside the log's own steps, compaction and vacuum: nothing is lost or doubled.

Each case prepares a store, then a child process runs one store operation with
DYNGEN_CRASH_AT set and dies at that point, like the OOM killer would kill it. Then:
the head is the old version or the new one, `verify` is clean, every row is there once,
the same operation rerun converges, and `gc` leaves only files some kept version names.
Every point of dyngen.faults.STORE_CRASH_POINTS is covered, and compaction is also killed
inside its commit (before and after the record's link).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from dyngen.errors import VersionVacuumedError
from dyngen.faults import CRASH_ENV, STORE_CRASH_POINTS
from dyngen.store import CompactionPolicy, Store, gc, verify
from dyngen.store.index import INDEX_DIR, usable_sidecar
from dyngen.store.minhash import LshParams
from dyngen.store.retention import live_files
from tests.reliability.helpers import REPO, files_on_disk
from tests.rows import verl_rows

POLICY = CompactionPolicy(max_small_shards=4, fan_in=4)
REJECT = [{"reason": "duplicate", "detail": "seen", "row": "{}"}]
_OPERATION = """
import sys
from dyngen.store import CompactionPolicy, Store
from tests.rows import verl_rows
op, root = sys.argv[1], sys.argv[2]
if op == "append":
    Store(root, checkpoint_interval=4).append("ds", verl_rows(1, start=100),
                                              idempotency_key="event:again")
elif op == "compact":
    Store(root).compact("ds", CompactionPolicy(max_small_shards=4, fan_in=4))
elif op == "vacuum":
    Store(root).vacuum("ds", keep_versions=1, grace_seconds=0)
elif op == "index":
    from dyngen.store.index import rebuild_index
    from dyngen.store.minhash import LshParams
    rebuild_index(Store(root), "ds", LshParams())
"""


@dataclass(frozen=True)
class Case:
    """A store to build, the operation to kill, and the head version after the kill."""

    build: Callable[[Store], list[int]]  # returns the head's row indices
    operation: str
    old: int
    new: int
    head_after: int


def keyed(store: Store) -> list[int]:
    """v0, then v1..v3 with keys event:1..3: the next commit (v4, a checkpoint with K=4)
    marks event:3 first."""
    store.create("ds", verl_rows(2))
    for v in range(1, 4):
        store.append("ds", verl_rows(1, start=1 + v), idempotency_key=f"event:{v}")
    return [0, 1, 2, 3, 4]


def small_shards(store: Store) -> list[int]:
    """v0..v8: nine shards of one row, and quarantine shards, for compaction."""
    store.create("ds", verl_rows(1))
    for r in range(8):
        store.append("ds", verl_rows(1, start=1 + r), rejected=REJECT)
    return list(range(9))


def compacted(store: Store) -> list[int]:
    """small_shards, then a full compaction (v9): vacuum has old shards to delete."""
    rows = small_shards(store)
    store.compact("ds", full=True)
    return rows


def unindexed(store: Store) -> list[int]:
    """v0..v2 written without near-duplicate sidecars, as by dyngen before them."""
    store.create("ds", verl_rows(1), index=None)
    for v in range(1, 3):
        store.append("ds", verl_rows(1, start=v), index=None)
    return [0, 1, 2]


CASES = {
    ("append", "store.after_sidecar_write"): Case(keyed, "append", 3, 4, 3),
    ("compact", "store.after_sidecar_write"): Case(small_shards, "compact", 8, 9, 8),
    ("index", "index.after_derived_write"): Case(unindexed, "index", 2, 2, 2),
    ("append", "store.after_key_marker"): Case(keyed, "append", 3, 4, 3),
    ("append", "store.checkpoint_before_link"): Case(keyed, "append", 3, 4, 4),
    ("append", "store.checkpoint_after_link"): Case(keyed, "append", 3, 4, 4),
    ("compact", "compact.after_shard_write"): Case(small_shards, "compact", 8, 9, 8),
    ("compact", "store.before_link"): Case(small_shards, "compact", 8, 9, 8),
    ("compact", "store.after_link"): Case(small_shards, "compact", 8, 9, 9),
    ("compact", "compact.after_commit"): Case(small_shards, "compact", 8, 9, 9),
    ("vacuum", "vacuum.after_record"): Case(compacted, "vacuum", 9, 10, 10),
    ("vacuum", "store.after_first_delete"): Case(compacted, "vacuum", 9, 10, 10),
}


def test_every_store_crash_point_has_a_case_and_is_placed_in_the_code() -> None:
    assert sorted({point for _, point in CASES} & set(STORE_CRASH_POINTS)) == sorted(
        STORE_CRASH_POINTS)
    code = "".join(p.read_text() for p in (REPO / "dyngen").rglob("*.py"))
    assert [p for p in STORE_CRASH_POINTS if f'crash_point("{p}")' not in code] == []


def run_killed(root: Path, operation: str, point: str | None) -> int:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if point is not None:
        env[CRASH_ENV] = point
    proc = subprocess.run([sys.executable, "-c", _OPERATION, operation, str(root)], env=env,
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert point is not None or proc.returncode == 0, proc.stderr[-3000:]
    return proc.returncode


def rows(store: Store) -> list[int]:
    return [e["index"] for e in Store(store.root).load("ds")["extra_info"]]


@pytest.mark.parametrize(("operation", "point"), list(CASES))
def test_a_store_operation_killed_at_a_point_recovers(tmp_path: Path, operation: str,
                                                      point: str) -> None:
    case = CASES[(operation, point)]
    store = Store(tmp_path / "store", checkpoint_interval=4)
    expected = case.build(store)
    if operation == "append":
        expected = [*expected, 100]

    assert run_killed(store.root, operation, point) == -signal.SIGKILL
    fresh = Store(store.root)
    assert fresh.head_version("ds") == case.head_after
    assert verify(fresh, "ds") == []
    if case.head_after == case.old and operation == "append":
        assert rows(fresh) == expected[:-1]
    else:
        assert rows(fresh) == expected  # every row once, old head or new

    run_killed(store.root, operation, None)  # the same operation again
    fresh = Store(store.root)
    assert verify(fresh, "ds") == []
    assert rows(fresh) == expected
    _check_converged(fresh, case)


def _check_converged(store: Store, case: Case) -> None:
    head = store.state("ds")
    if case.operation == "append":
        assert head.version == case.new  # the key landed once
        assert store.find_idempotency_key("ds", "event:again").version == case.new
        assert store.log("ds").marked_version("event:3") == 3
        writer = Store(store.root, checkpoint_interval=4)
        for v in range(case.new, 8):
            writer.append("ds", verl_rows(1, start=200 + v))
        checkpoint = Store(store.root).log("ds").newest_checkpoint(8)
        assert checkpoint is not None and checkpoint.version == 8  # checkpoints resumed
    elif case.operation == "compact":
        assert head.version == case.new and len(head.shards) < 9  # compacted exactly once
        assert store.compact("ds", POLICY) == []
    elif case.operation == "index":
        assert head.version == case.old  # indexing commits nothing
        sidecars = [usable_sidecar(store, "ds", s, LshParams()) for s in head.shards]
        assert [int(s.header["rows"]) for s in sidecars if s is not None] == [1, 1, 1]
    else:
        assert head.version == case.new and head.expired_before == case.old
        with pytest.raises(VersionVacuumedError):
            store.load("ds", 3)
    gc(store, "ds", grace_seconds=0)  # removes what the crash left, nothing a version needs
    kept = live_files(store, "ds", Store(store.root).state("ds").expired_before)
    # A derived sidecar is kept while its shard is: live names it by the shard's hash.
    on_disk = {f"{INDEX_DIR}/{f[len(INDEX_DIR) + 1:].partition('-')[0]}"
               if f.startswith(f"{INDEX_DIR}/") else f for f in files_on_disk(store, "ds")}
    assert on_disk == {f for f in kept if not f.startswith(f"{INDEX_DIR}/")} | (
        on_disk & kept)
    assert verify(store, "ds") == []
