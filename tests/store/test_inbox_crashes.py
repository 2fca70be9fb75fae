"""The crash property for the inbox: a trainer or a round SIGKILLed anywhere leaves each
batch end written whole or not at all, and each covered once or not at all.

A forked child writes a batch end (its rollouts file, then its entry) or runs a round
covering what is pending, and is killed at a named crash point (`dyngen.faults`) or
after a random delay. Then, from a fresh `Store`: the entry is absent or whole (its
rollouts readable); the head is the old version (everything still pending) or the new
one (nothing pending); the operation retried lands exactly once; `verify` is clean and,
after `gc`, nothing is an orphan.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from dyngen.store import Store, gc, verify
from tests.rows import verl_rows
from tests.store.forking import killed

ROLLOUTS = [{"prompt": f"Question {i}: " + "x" * 300, "score": i % 2} for i in range(200)]
WRITE_POINTS = ("inbox.after_rollouts_write", "inbox.before_link", "inbox.after_link")
ROUND_POINTS = ("store.after_shard_write", "store.after_temp_record", "store.before_link",
                "store.after_link", "store.checkpoint_before_link")


def write(root: Path) -> None:
    Store(root).write_batch_end("ds", "run", 3, {"m": 1.0}, ROLLOUTS, event_id="e-3")


def covering_round(root: Path) -> None:
    store = Store(root, checkpoint_interval=2)
    store.append("ds", verl_rows(1, start=50), covers=store.pending("ds"),
                 idempotency_key="round:1", compact=False)




def clean(root: Path) -> None:
    """After gc, nothing is an orphan and verify finds nothing."""
    gc(Store(root), "ds", grace_seconds=0)
    assert gc(Store(root), "ds", grace_seconds=0, dry_run=True) == []
    assert verify(Store(root), "ds") == []


def check_after_killed_write(root: Path) -> None:
    fresh = Store(root)
    found = fresh.batch_end("ds", "run", 3)
    if found is not None:  # whole, with its rollouts in the store
        assert found.metrics == {"m": 1.0} and fresh.read_rollouts(found) == ROLLOUTS
    again = Store(root).write_batch_end("ds", "run", 3, {"m": 1.0}, ROLLOUTS)
    assert again.created is (found is None) and again.differs == ()
    clean(root)
    assert [e.key for e in Store(root).pending("ds")] == [("run", 3)]
    assert Store(root).read_rollouts(Store(root).batch_end("ds", "run", 3)) == ROLLOUTS


def prepared(root: Path) -> None:
    store = Store(root, checkpoint_interval=2)
    store.create("ds", verl_rows(1))
    store.write_batch_end("ds", "run", 0, {"m": 0.0})
    store.write_batch_end("ds", "run", 1, {"m": 1.0}, ROLLOUTS)


def check_after_killed_round(root: Path) -> None:
    fresh = Store(root)
    head = fresh.head_version("ds")
    assert head in (0, 1)
    assert [e.key for e in fresh.pending("ds")] == ([("run", 0), ("run", 1)] if head == 0
                                                    else [])
    covering_round(root)  # the round retried: it lands once
    after = Store(root)
    assert after.head_version("ds") == 1 and after.pending("ds") == []
    assert after.record("ds", 1).covers == (("run", 0), ("run", 1))
    clean(root)


@pytest.mark.parametrize("point", WRITE_POINTS)
def test_a_trainer_killed_while_writing_a_batch_end(tmp_path: Path, point: str) -> None:
    Store(tmp_path).create("ds", verl_rows(1))
    assert killed(tmp_path, write, point=point)
    check_after_killed_write(tmp_path)


@pytest.mark.parametrize("point", ROUND_POINTS)
def test_a_covering_round_killed_at_each_crash_point(tmp_path: Path, point: str) -> None:
    prepared(tmp_path)
    if point.startswith("store.checkpoint"):  # version 2 is the one that checkpoints
        Store(tmp_path).append("ds", [], compact=False)
    assert killed(tmp_path, covering_round, point=point)
    if point.startswith("store.checkpoint"):
        fresh = Store(tmp_path)
        assert fresh.head_version("ds") == 2 and fresh.pending("ds") == []
        assert verify(fresh, "ds") == []
        return
    check_after_killed_round(tmp_path)


@settings(max_examples=10, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.sampled_from(["write", "round"]), delay=st.floats(0, 0.08))
def test_a_trainer_or_round_killed_at_a_random_moment(
        tmp_path_factory: pytest.TempPathFactory, which: str, delay: float) -> None:
    root = tmp_path_factory.mktemp("inbox-crash")
    if which == "write":
        Store(root).create("ds", verl_rows(1))
        died = killed(root, write, delay=delay)
        check_after_killed_write(root)
    else:
        prepared(root)
        died = killed(root, covering_round, delay=delay)
        check_after_killed_round(root)
    event(f"{which}: {'killed' if died else 'finished first'}")
