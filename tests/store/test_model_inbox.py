"""The inbox and the versions covering it, under a model checker (a hypothesis state machine).

Trainers write batch ends (new steps, steps skipped and written late, re-sends with the
same or other content, two runs, through two Store objects), and rounds read what is
pending and commit a version covering it: in flight on two Store objects at once, so they
race, some abandoned before their commit, some retried (with their idempotency key, or
without). Every write is read back from a fresh Store. After every step, from a fresh
Store: the inbox and `pending` are the model's; every batch end is covered by one version
at most; each run's steps are covered in order (no version covers a step while an earlier
step written before its commit is uncovered); the covering versions are the model's; and
with no round in flight, `verify` is clean and `gc` finds no orphan. A round that starts
after the last write and runs until it commits (or finds nothing pending) leaves nothing
pending.

Kept small for CI (a few seconds); DYNGEN_MODEL_SCALE=N runs N times more.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from dyngen.errors import CommitConflictError
from dyngen.store import AlreadyCoveredError, CoverageOrderError, PendingCommit, Store, gc, verify
from tests.rows import verl_rows
from tests.store.test_model_store import run

NAME = "ds"
RUNS = ("run-a", "run b/é")
Key = tuple[str, int]


@dataclass
class Round:
    """A round in flight: what it read, its pending commit, its idempotency key."""

    store: int
    covers: tuple[Key, ...]
    read_at: int  # the model's clock when it read pending
    pending: PendingCommit | None = None
    key: str | None = None


def inbox_machine(open_store: Callable[[], Callable[..., Store]]) -> type[RuleBasedStateMachine]:
    class InboxMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.opener = open_store()
            self.stores = [self.opener(checkpoint_interval=2), self.opener()]
            self.clock = 0
            self.written: dict[Key, tuple[float, int]] = {}  # first metric value, write time
            self.next_step = dict.fromkeys(RUNS, 0)
            self.covered_by: dict[Key, int] = {}
            self.committed_at: dict[int, int] = {}  # version -> the model's clock
            self.keys: dict[str, int] = {}  # idempotency key -> version
            self.head = 0
            self.in_flight: list[Round] = []
            self.done: list[Round] = []
            self.last_write = -1

        def tick(self) -> int:
            self.clock += 1
            return self.clock

        # ---- trainers ------------------------------------------------------------
        def write(self, writer: int, run_id: str, step: int, value: float) -> None:
            entry = self.stores[writer].write_batch_end(NAME, run_id, step, {"m": value})
            first = self.written.get((run_id, step))
            assert entry.created is (first is None)
            if first is None:
                self.written[(run_id, step)] = (value, self.tick())
                self.last_write = self.clock
            else:
                assert entry.metrics == {"m": first[0]}
                assert entry.differs == (() if value == first[0] else ("metrics",))
            self.stores[writer] = self.opener(checkpoint_interval=1 + self.clock % 3)
            again = self.opener().batch_end(NAME, run_id, step)
            assert again is not None and again.metrics == {"m": self.written[entry.key][0]}

        @initialize()
        def create(self) -> None:
            self.stores[0].create(NAME, verl_rows(1))

        @rule(writer=st.integers(0, 1), run_id=st.sampled_from(RUNS), skip=st.booleans(),
              value=st.sampled_from([0.0, 0.5]))
        def batch_end(self, writer: int, run_id: str, skip: bool, value: float) -> None:
            """The next step, or the one after it (the skipped one may come late)."""
            step = self.next_step[run_id] + int(skip)
            self.next_step[run_id] = step + 1
            self.write(writer, run_id, step, value)

        @precondition(lambda self: self.written)
        @rule(data=st.data(), writer=st.integers(0, 1), value=st.sampled_from([0.0, 0.5]))
        def resend(self, data: st.DataObject, writer: int, value: float) -> None:
            run_id, step = data.draw(st.sampled_from(sorted(self.written)), label="key")
            self.write(writer, run_id, step, value)

        @precondition(lambda self: any(self.late_steps(r) for r in RUNS))
        @rule(data=st.data(), writer=st.integers(0, 1))
        def late_batch_end(self, data: st.DataObject, writer: int) -> None:
            run_id = data.draw(st.sampled_from([r for r in RUNS if self.late_steps(r)]))
            step = data.draw(st.sampled_from(self.late_steps(run_id)), label="step")
            self.write(writer, run_id, step, 1.0)

        def late_steps(self, run_id: str) -> list[int]:
            return [s for s in range(self.next_step[run_id]) if (run_id, s) not in self.written]

        # ---- rounds --------------------------------------------------------------
        def pending_keys(self) -> list[Key]:
            return sorted(k for k in self.written if k not in self.covered_by)

        def begin(self, which: int, keyed: bool) -> Round:
            """A round reads what is pending and writes its rows, not yet committed."""
            covers = tuple(e.key for e in self.stores[which].pending(NAME))
            assert list(covers) == self.pending_keys()
            store = self.stores[which]
            assert store.pending_keys(NAME, store.head_version(NAME)) == list(covers)
            key = f"round:{uuid.uuid4().hex[:8]}" if keyed else None
            pending = self.stores[which].prepare_append(
                NAME, verl_rows(1, start=self.clock), covers=covers, idempotency_key=key)
            return Round(which, covers, self.tick(), pending, key)

        @rule(which=st.integers(0, 1), keyed=st.booleans())
        def start_round(self, which: int, keyed: bool) -> None:
            self.in_flight.append(self.begin(which, keyed))

        @rule(first=st.integers(0, 1), keyed=st.booleans(), late=st.booleans(),
              run_id=st.sampled_from(RUNS))
        def racing_rounds(self, first: int, keyed: bool, late: bool, run_id: str) -> None:
            """A round on each Store reads pending (a batch end may come in between: a late
            step if the run skipped one), then both commit: the second finds what the first
            covered covered, the first may find a late step before its own."""
            rounds = [self.begin(first, keyed)]
            if late and self.late_steps(run_id):
                self.write(0, run_id, self.late_steps(run_id)[-1], 0.0)
            elif late:
                self.batch_end(0, run_id, False, 0.0)
            rounds.append(self.begin(1 - first, keyed))
            for this in rounds:
                assert this.pending is not None
                self.land(this, self.stores[this.store], this.pending)
                self.done.append(this)

        @precondition(lambda self: self.in_flight)
        @rule(data=st.data())
        def commit_round(self, data: st.DataObject) -> None:
            at = data.draw(st.integers(0, len(self.in_flight) - 1), label="round")
            this = self.in_flight.pop(at)
            assert this.pending is not None
            self.land(this, self.stores[this.store], this.pending)
            self.done.append(this)

        @precondition(lambda self: self.in_flight)
        @rule(data=st.data())
        def abandon_round(self, data: st.DataObject) -> None:
            at = data.draw(st.integers(0, len(self.in_flight) - 1), label="round")
            this = self.in_flight.pop(at)
            assert this.pending is not None
            self.stores[this.store].abort(this.pending)

        @precondition(lambda self: self.done)
        @rule(data=st.data(), which=st.integers(0, 1))
        def retry_round(self, data: st.DataObject, which: int) -> None:
            """A round run again with what it read then (re-delivered, or retried)."""
            this = data.draw(st.sampled_from(self.done), label="round")
            store = self.stores[which]
            pending = store.prepare_append(NAME, verl_rows(1, start=self.clock),
                                           covers=this.covers, idempotency_key=this.key)
            self.land(Round(which, this.covers, this.read_at, key=this.key), store, pending)

        @rule(which=st.integers(0, 1), compact=st.booleans())
        def full_round(self, which: int, compact: bool) -> None:
            """Read pending, commit covering it; on losing a race, read again."""
            store = self.stores[which]
            for _ in range(3):
                covers = tuple(e.key for e in store.pending(NAME))
                if not covers:
                    break
                record = store.append(NAME, verl_rows(1, start=self.clock), covers=covers,
                                      compact=compact)
                self.committed(record.version, covers)
                self.head = max((record.version, *record.compactions))
            assert store.pending(NAME) == [] and self.pending_keys() == []

        def land(self, this: Round, store: Store, pending: PendingCommit) -> None:
            """Commit a round's pending commit; the outcome is the model's."""
            expected = self.outcome(this)
            if isinstance(expected, int):
                if pending.parent != self.head and expected == self.head + 1:
                    with pytest.raises(CommitConflictError):
                        store.commit(pending)
                record = store.commit_with_rebase(pending)
                assert record.version == expected
                if expected == self.head + 1:
                    self.committed(expected, this.covers)
                    self.head = expected
                    if this.key is not None:
                        self.keys[this.key] = expected
                    if this.read_at > self.last_write:  # it started after the last write
                        assert self.pending_keys() == []
                return
            with pytest.raises(expected[0]) as caught:
                store.commit_with_rebase(pending)
            if expected[0] is AlreadyCoveredError:
                assert (caught.value.version, caught.value.head) == expected[1:]

        def outcome(self, this: Round) -> int | tuple:
            """The version a round lands as, or the error it gets (with its fields)."""
            if this.key is not None and this.key in self.keys:
                return self.keys[this.key]
            already = [k for k in this.covers if k in self.covered_by]
            if already:
                return AlreadyCoveredError, self.covered_by[already[0]], self.head
            for run_id, step in this.covers:
                for earlier in self.written:
                    if (earlier[0] == run_id and earlier[1] < step
                            and earlier not in self.covered_by and earlier not in this.covers):
                        return (CoverageOrderError,)
            return self.head + 1

        def committed(self, version: int, covers: tuple[Key, ...]) -> None:
            for key in covers:
                assert key not in self.covered_by
                self.covered_by[key] = version
            self.committed_at[version] = self.tick()

        # ---- what a fresh Store shows ----------------------------------------------
        @invariant()
        def inbox_and_pending_are_the_models(self) -> None:
            fresh = self.opener()
            entries = fresh.batch_ends(NAME)
            assert [e.key for e in entries] == sorted(self.written)
            assert all(e.metrics == {"m": self.written[e.key][0]} for e in entries)
            assert [e.key for e in fresh.pending(NAME)] == self.pending_keys()
            assert fresh.state(NAME).covered == self.stores[0].state(NAME).covered

        @invariant()
        def each_batch_end_is_covered_once_and_in_order(self) -> None:
            fresh = self.opener()
            assert fresh.head_version(NAME) == self.head
            seen: dict[Key, int] = {}
            for entry in fresh.entries(NAME, oldest_first=True):
                for key in entry.covers:
                    assert key not in seen, f"{key} covered by {seen[key]} and {entry.version}"
                    seen[key] = entry.version
                    written = self.written[key][1]
                    assert written < self.committed_at[entry.version]
                    for (r, s), (_, at) in self.written.items():
                        if r == key[0] and s < key[1] and at < self.committed_at[entry.version]:
                            assert seen.get((r, s), entry.version + 1) <= entry.version
            assert seen == self.covered_by
            for key, version in list(seen.items())[:3]:
                assert fresh.covering_version(NAME, *key) == version

        @invariant()
        def clean_when_no_round_is_in_flight(self) -> None:
            if not self.in_flight:
                fresh = self.opener()
                assert verify(fresh, NAME) == []
                assert gc(fresh, NAME, grace_seconds=0, dry_run=True) == []

        def teardown(self) -> None:
            for this in self.in_flight:
                assert this.pending is not None
                self.stores[this.store].abort(this.pending)

    return InboxMachine


def test_the_inbox_on_a_local_folder_matches_the_model(tmp_path: Path) -> None:
    def new_root() -> Callable[..., Store]:
        root = tmp_path / uuid.uuid4().hex
        return lambda **kw: Store(root, cache_dir=tmp_path / "cache", **kw)

    run(inbox_machine(new_root), examples=8, steps=12)


def test_the_inbox_on_memory_matches_the_model(tmp_path: Path) -> None:
    import fsspec

    base = f"dyngen-inbox-model-{uuid.uuid4().hex}"

    def new_root() -> Callable[..., Store]:
        root = f"memory://{base}/{uuid.uuid4().hex}"
        return lambda **kw: Store(root, cache_dir=tmp_path / "cache", **kw)

    try:
        run(inbox_machine(new_root), examples=5, steps=12)
    finally:
        memory = fsspec.filesystem("memory")
        if memory.exists(base):
            memory.rm(base, recursive=True)
