"""Many processes running rounds of one dataset at once: contiguous versions, no row lost.

Rounds are real `generation_round` flow runs in separate processes against the session's
Prefect server. Nothing makes them take turns: the store's exclusive commit (a loser
rebases onto the newer head) is what keeps every version and row. The store alone is
covered in tests/store/test_store.py: deterministically
(`test_two_writers_on_one_parent_one_conflicts_then_rebases`: the loser gets `expected
parent 0, found 1` and rebases) and with racing processes
(`test_four_processes_times_ten_appends_are_contiguous_and_exact`).
"""

from __future__ import annotations

import time
from collections import Counter

import pytest

from dyngen.store import Store, gc, verify
from tests.reliability.helpers import launch_rounds, round_config, summaries
from tests.rows import verl_rows

pytestmark = [pytest.mark.usefixtures("prefect_server"), pytest.mark.e2e]

PROCESSES = 4
ROUNDS_EACH = 3
DATASET = "race"


def test_four_processes_times_three_rounds_give_twelve_contiguous_versions(tmp_path) -> None:
    store = Store(tmp_path / "store")
    store.create(DATASET, verl_rows(4))

    def rounds_of(proc: int) -> list[dict]:
        return [{"config": round_config(store, start=1000 * proc + 10 * i, n=2),
                 "trigger": {"event_id": f"p{proc}-r{i}", "step": 100 * proc + i}}
                for i in range(ROUNDS_EACH)]

    started = time.monotonic()
    children = [launch_rounds(DATASET, rounds_of(p)) for p in range(1, PROCESSES + 1)]
    deadline = time.monotonic() + 240
    finished = [c.finish(timeout=max(1.0, deadline - time.monotonic())) for c in children]
    for returncode, _, err in finished:
        assert returncode == 0, err[-3000:]
    results = [r for _, out, _ in finished for r in summaries(out)]
    total = PROCESSES * ROUNDS_EACH
    assert len(results) == total and all(r["created"] for r in results)

    history = store.history(DATASET)
    assert [r.version for r in history] == list(range(total + 1))
    assert [r.parent for r in history] == [None, *range(total)]
    # Each round expected the version after the head it loaded; one that lost the race
    # rebased onto the newer head, and its record says the version it made.
    assert all(r.lineage["round"] <= r.version for r in history[1:])

    head = store.load(DATASET)
    index = [e["index"] for e in head["extra_info"]]
    expected = [*range(4), *(1000 * p + 10 * i + k for p in range(1, PROCESSES + 1)
                             for i in range(ROUNDS_EACH) for k in range(2))]
    assert Counter(index) == Counter(expected)  # every kept row, each exactly once
    assert len(index) == len(expected)
    # Each row sits in the version committed for the trigger that generated it.
    event_of = {r.version: r.lineage["trigger"]["event_id"] for r in history[1:]}
    for i, version in zip(index[4:], head["_dyngen_version"][4:], strict=True):
        assert event_of[version] == f"p{i // 1000}-r{i % 1000 // 10}"
    assert store.load_rejected(DATASET)["reason"] == ["duplicate"] * total

    assert verify(store, DATASET) == []
    assert gc(store, DATASET, grace_seconds=0) == []
    print(f"\nconcurrency: {PROCESSES} processes x {ROUNDS_EACH} rounds -> {total} contiguous "
          f"versions in {time.monotonic() - started:.1f} s")
