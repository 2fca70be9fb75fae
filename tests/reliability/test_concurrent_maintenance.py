"""Rounds racing compactions and a vacuum, in separate processes, on one dataset.

Four processes run ten rounds each through the store API as a round calls it (key
lookup, head load, dedup against the head, prepare + commit with the trigger's key, then
the round's compaction), with no round guard, so every commit races. Meanwhile one
process compacts in a loop and another vacuums (keep 3 versions, an 8 s grace period).
Afterwards: every row exactly once, versions contiguous, each key committed once, and
every kept version still loads and verifies (no kept version lost a shard).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from dyngen.store import Store, verify
from tests.reliability.helpers import REPO
from tests.rows import verl_rows

PROCESSES, ROUNDS, GRACE = 4, 10, 8.0
_WRITER = """
import sys
from dyngen.store import CompactionPolicy, Store
from dyngen.store.keys import prompt_keys
from tests.rows import verl_row
root, proc, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
policy = CompactionPolicy(max_small_shards=4, fan_in=4)
for i in range(rounds):
    key = f"event:p{proc}-r{i}"
    if Store(root).find_idempotency_key("ds", key) is not None:
        continue
    head = Store(root).state("ds")
    Store(root).load("ds")  # the round's load (the head may have moved on: no matter)
    rows = [verl_row(1000 * proc + 10 * i + k, source=f"p{proc}") for k in range(2)]
    rows.append(verl_row(0))  # a duplicate of version 0's first row
    seen = Store(root).contains_prompts("ds", prompt_keys([r["prompt"] for r in rows]),
                                        head.version)
    kept = [r for r, dup in zip(rows, seen) if not dup]
    rejected = [{"reason": "duplicate", "detail": "", "row": "{}"} for dup in seen if dup]
    store = Store(root)
    pending = store.prepare_append("ds", kept, rejected=rejected, idempotency_key=key,
                                   round_id=f"p{proc}-r{i}", generator="race")
    store.commit_with_rebase(pending)
    Store(root).compact("ds", policy)
"""
_MAINTAINER = """
import sys, time
from pathlib import Path
from dyngen.errors import CompactionConflictError
from dyngen.store import Store
root, job, stop, grace = sys.argv[1], sys.argv[2], Path(sys.argv[3]), float(sys.argv[4])
while not stop.exists():
    if job == "compact":
        Store(root).compact("ds", full=True)
    else:
        result = Store(root).vacuum("ds", keep_versions=3, grace_seconds=grace)
        if result.removed:
            print(len(result.removed), flush=True)
    time.sleep(0.05)
"""


def spawn(script: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-c", script, *args], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_rounds_racing_compactions_and_a_vacuum_lose_and_double_nothing(tmp_path: Path) -> None:
    root, stop = tmp_path / "store", tmp_path / "stop"
    store = Store(root)
    store.create("ds", verl_rows(4))
    for v in range(1, 21):  # an older history of small shards for the vacuum to delete
        store.append("ds", verl_rows(1, start=100 + v))
    time.sleep(GRACE + 0.5)  # ... no longer the head within the grace period
    history = [store.dataset_dir("ds") / f for f in Store(root).state("ds").files]
    maintainers = [spawn(_MAINTAINER, str(root), job, str(stop), str(GRACE))
                   for job in ("compact", "vacuum")]
    try:
        writers = [spawn(_WRITER, str(root), str(p), str(ROUNDS))
                   for p in range(1, PROCESSES + 1)]
        for proc in writers:
            _, err = proc.communicate(timeout=600)
            assert proc.returncode == 0, err[-3000:]
        # Let the vacuum outlast the grace period of the race's first commits, so the
        # old history's files become deletable, however fast the race went.
        deadline = time.monotonic() + 6 * GRACE
        while time.monotonic() < deadline and all(f.exists() for f in history):
            time.sleep(0.2)
    finally:
        stop.touch()
    outputs = [m.communicate(timeout=120) for m in maintainers]
    for m, (_, err) in zip(maintainers, outputs, strict=True):
        assert m.returncode == 0, err[-3000:]
    deleted = sum(int(n) for n in outputs[1][0].split())

    fresh = Store(root)
    head = fresh.state("ds")
    index = [e["index"] for e in fresh.load("ds")["extra_info"]]
    expected = [*range(4), *range(101, 121), *(1000 * p + 10 * i + k
                                                for p in range(1, PROCESSES + 1)
                                                for i in range(ROUNDS) for k in range(2))]
    assert Counter(index) == Counter(expected) and len(index) == len(expected)
    assert fresh.load_rejected("ds")["reason"] == ["duplicate"] * (PROCESSES * ROUNDS)
    log = fresh.log("ds")
    assert log.versions() == list(range(head.version + 1))  # contiguous
    entries = [log.entry(v) for v in range(head.version + 1)]
    assert all(e.parent == e.version - 1 for e in entries[1:])
    keys = [e.idempotency_key for e in entries if e.idempotency_key is not None]
    assert len(keys) == len(set(keys)) == PROCESSES * ROUNDS  # each round committed once
    operations = Counter(e.operation for e in entries)
    assert operations["compact"] > 0 and operations["vacuum"] > 0
    assert head.expired_before >= 21 and deleted > 0, (head.expired_before, deleted)
    for version in range(head.expired_before, head.version + 1):  # no kept version lost one
        assert fresh.load("ds", version).num_rows == entries[version].rows
    assert verify(fresh, "ds") == []
    print(f"\nrace: {len(keys)} rounds, {operations['compact']} compactions, "
          f"{operations['vacuum']} vacuums ({deleted} files deleted) -> {head.version + 1} "
          f"contiguous versions")
