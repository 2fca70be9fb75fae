"""The crash property: a writer SIGKILLed anywhere leaves the old head or the new one whole.

A forked child runs one store operation (a keyed append, a keyed restore, a compaction,
a vacuum) and is killed at each named crash point (`dyngen.faults`), or after a random
delay. Then, from a fresh `Store`: the head is the old version or the new one with
exactly the rows the operation makes, `verify` is clean, the operation retried (with the
same idempotency key) lands exactly once, and after `gc` nothing on disk is an orphan.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from dyngen.faults import CRASH_POINTS, STORE_CRASH_POINTS
from dyngen.store import Store, gc, verify
from dyngen.store.retention import live_files
from tests.rows import verl_rows
from tests.store.forking import killed

OLD_HEAD = 4
OLD_ROWS = [0, 1, 2, 3]
# What each operation leaves at the head: (its operation, the head's row indices).
OUTCOME = {"append": ("append", OLD_ROWS + [100]), "restore": ("restore", [0, 1]),
           "compact": ("compact", OLD_ROWS), "vacuum": ("vacuum", OLD_ROWS)}
# The operation that passes each crash point (a round's own points are not the store's).
POINT_OPERATION = {p: "append" for p in CRASH_POINTS if p.startswith("store.")} | {
    "store.after_key_marker": "append", "store.checkpoint_before_link": "append",
    "store.checkpoint_after_link": "append", "store.after_sidecar_write": "append",
    "compact.after_shard_write": "compact", "compact.after_commit": "compact",
    "vacuum.after_record": "vacuum", "store.after_first_delete": "vacuum",
}


def build(root: Path) -> None:
    """v0..v2 one row each (keys event:1, event:2), v3 their full compaction, v4 a keyed
    append whose key's marker the next commit writes; that commit (v5, K=5) checkpoints,
    and a vacuum keeping one version deletes v0..v2's shards."""
    store = Store(root, checkpoint_interval=5)
    store.create("ds", verl_rows(1))
    for v in range(1, 3):
        store.append("ds", verl_rows(1, start=v), idempotency_key=f"event:{v}", compact=False)
    store.compact("ds", full=True)
    store.append("ds", verl_rows(1, start=3), idempotency_key="event:4", compact=False)


def operate(root: Path, operation: str) -> None:
    """One store operation, as a writer process would run it."""
    store = Store(root, checkpoint_interval=5)
    if operation == "append":
        store.append("ds", verl_rows(1, start=100), idempotency_key="event:again",
                     compact=False)
    elif operation == "restore":
        store.restore("ds", 1, idempotency_key="restore:again")
    elif operation == "compact":
        store.compact("ds", full=True)
    else:
        store.vacuum("ds", keep_versions=1, grace_seconds=0)


def killed_writer(root: Path, operation: str, *, point: str | None = None,
                  delay: float | None = None) -> bool:
    """Fork a writer running `operation`; it dies at `point` or is killed after `delay`.
    Whether it died (rather than finishing first)."""
    return killed(root, lambda r: operate(r, operation), point=point, delay=delay,
                  what=f"the writer running {operation}")


def indices(store: Store, version: int | None = None) -> list[int]:
    return [e["index"] for e in store.load("ds", version)["extra_info"]]


def check_after_crash(root: Path, operation: str) -> None:
    """Old head or new head whole; verify clean; a retry lands once; gc leaves no orphan."""
    kind, rows = OUTCOME[operation]
    fresh = Store(root)
    head = fresh.head_version("ds")
    assert head is not None and head >= OLD_HEAD
    assert all(fresh.record("ds", v).operation == kind for v in range(OLD_HEAD + 1, head + 1))
    assert indices(fresh) == (OLD_ROWS if head == OLD_HEAD else rows)
    assert verify(fresh, "ds") == []

    operate(root, operation)  # the retry
    after = Store(root)
    assert indices(after) == rows
    if operation in ("append", "restore"):
        key = "event:again" if operation == "append" else "restore:again"
        assert [e.version for e in after.entries("ds") if e.idempotency_key == key] == [
            OLD_HEAD + 1]
        assert after.head_version("ds") == OLD_HEAD + 1
    if operation == "vacuum":
        assert after.state("ds").expired_before == OLD_HEAD
        assert after.head_version("ds") == OLD_HEAD + 1

    gc(after, "ds", grace_seconds=0)
    assert gc(Store(root), "ds", grace_seconds=0, dry_run=True) == []
    live = live_files(after, "ds", after.state("ds").expired_before)
    base = Path(after.dataset_dir("ds"))
    on_disk = {f"{sub}/{p.name}" for sub in ("data", "rejected") if (base / sub).is_dir()
               for p in (base / sub).iterdir()}
    assert on_disk <= live, on_disk - live
    assert verify(Store(root), "ds") == []
    assert indices(Store(root)) == rows


@pytest.mark.parametrize("point", sorted(set(STORE_CRASH_POINTS) & set(POINT_OPERATION))
                         + sorted(p for p in CRASH_POINTS if p in POINT_OPERATION))
def test_a_writer_killed_at_each_crash_point(tmp_path: Path, point: str) -> None:
    build(tmp_path)
    assert killed_writer(tmp_path, POINT_OPERATION[point], point=point)  # it got there
    check_after_crash(tmp_path, POINT_OPERATION[point])


@settings(max_examples=16, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(operation=st.sampled_from(sorted(OUTCOME)), delay=st.floats(0, 0.12))
def test_a_writer_killed_at_a_random_moment(tmp_path_factory: pytest.TempPathFactory,
                                            operation: str, delay: float) -> None:
    root = tmp_path_factory.mktemp("crash")
    build(root)
    died = killed_writer(root, operation, delay=delay)
    event(f"{operation}: {'killed' if died else 'finished first'}")  # --hypothesis-show-statistics
    check_after_crash(root, operation)
