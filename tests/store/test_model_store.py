"""The store under a model checker: hypothesis state machines over the public `Store` API.

Each machine drives one dataset through create, appends (every input form, rows missing
keys, new extra_info fields, idempotency keys new and re-used, automatic compaction),
refused appends, abandoned and conflicting commits, restores, compactions, vacuums with
each rule, gc and reopening with small checkpoint intervals. After every step the writer
and a fresh `Store` are compared with a reference model (tests/store/store_model.py):
every version's rows through `load` and `to_arrow`, expired versions refused, keys,
generators, retention, `verify` clean and no orphan for `gc`.

Bounded for CI: a few dozen examples on a local folder and `memory://`, fewer on S3.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from dyngen.errors import CommitConflictError, SchemaMismatchError, VersionVacuumedError
from dyngen.store import CompactionPolicy, Store, gc
from tests.store.conftest import new_bucket, s3_options
from tests.store.store_model import (
    EXTRA_FIELDS,
    FORMS,
    OPTIONAL,
    Model,
    as_form,
    check,
    check_maintenance,
    make_row,
)

NAME = "ds"
SMALL = CompactionPolicy(max_small_shards=2, fan_in=2)
KEYS = [f"event:{i}" for i in range(4)]
GENERATORS = ["GenA", "GenB"]

row_specs = st.lists(
    st.tuples(st.frozensets(st.sampled_from(OPTIONAL), max_size=2),
              st.dictionaries(st.sampled_from(EXTRA_FIELDS), st.sampled_from(["a", "b", "é"]),
                              max_size=2)),
    min_size=0, max_size=3)


def store_machine(open_store: Callable[..., Store]) -> type[RuleBasedStateMachine]:
    """A state machine over stores that `open_store(**kwargs)` opens on a fresh root each
    example (called once per example with no arguments, then with the same root)."""

    class StoreMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.opener = open_store()  # a new root for this example
            self.writer = self.opener()
            self.reader = self.opener()  # long-lived: it reads what the writer commits
            self.model = Model()
            self.next_index = 0

        def rows(self, specs: list[tuple[frozenset[str], dict[str, str]]]) -> list[dict]:
            out = []
            for omit, extra in specs:
                out.append(make_row(self.next_index, omit, extra))
                self.next_index += 1
            return out

        @initialize(n=st.integers(1, 3), form=st.sampled_from(FORMS))
        def create(self, n: int, form: str) -> None:
            rows = self.rows([(frozenset(), {})] * n)
            self.writer.create(NAME, as_form(rows, form))
            self.model.create(rows)

        @rule(specs=row_specs, form=st.sampled_from(FORMS),
              key=st.none() | st.sampled_from(KEYS),
              generator=st.none() | st.sampled_from(GENERATORS),
              compact=st.sampled_from([False, True, SMALL]),
              rejected=st.lists(st.sampled_from(["duplicate", "schema"]), max_size=2))
        def append(self, specs: list, form: str, key: str | None, generator: str | None,
                   compact: Any, rejected: list[str]) -> None:
            rows = self.rows(specs)
            lineage = {"generator": {"class": generator}} if generator else None
            quarantined = [{"reason": r, "detail": f"d{self.next_index}", "row": "{}"}
                           for r in rejected]
            record = self.writer.append(NAME, as_form(rows, form), idempotency_key=key,
                                        lineage=lineage, compact=compact,
                                        rejected=quarantined or None)
            assert record.version == self.model.append(rows, key, generator, quarantined)
            self._compacted(record.compactions)

        @rule(bad=st.sampled_from(["column", "kind"]), form=st.sampled_from(FORMS))
        def refused_append(self, bad: str, form: str) -> None:
            good, row = self.rows([(frozenset(), {})] * 2)
            if bad == "column":  # a column the schema lacks, in the second row only
                rows = [good, {**row, "surprise": 1}]
            else:  # text where the schema has a number, in every row
                rows = [{**row, "extra_info": {**row["extra_info"], "index": "seven"}}]
            with pytest.raises(SchemaMismatchError):
                self.writer.append(NAME, as_form(rows, form))

        @rule(specs=row_specs.filter(bool))
        def abandoned_append(self, specs: list) -> None:
            """A writer that wrote its shards and died before committing: gc removes them."""
            pending = self.writer.prepare_append(NAME, self.rows(specs))
            written = {f for s in pending.new_shards for f in s.files}
            assert set(gc(self.opener(), NAME, grace_seconds=0)) == written

        @rule(specs=row_specs, other=row_specs, compaction=st.booleans())
        def conflicting_append(self, specs: list, other: list, compaction: bool) -> None:
            """Another writer commits first (an append, or a compaction that may find
            nothing to do): the commit conflicts, then lands rebased."""
            mine, theirs = self.rows(specs), self.rows(other)
            pending = self.writer.prepare_append(NAME, mine)
            if compaction:
                made = self.opener().compact(NAME, full=True)
                self._compacted(tuple(r.version for r in made))
            else:
                self.opener().append(NAME, theirs, compact=False)
                self.model.append(theirs, None, None)
            if pending.parent != self.model.head:
                with pytest.raises(CommitConflictError):
                    self.writer.commit(pending)
            record = self.writer.commit_with_rebase(self.writer.rebase(pending))
            assert record.version == self.model.append(mine, None, None)

        @rule(data=st.data(), key=st.none() | st.sampled_from(KEYS))
        def restore(self, data: st.DataObject, key: str | None) -> None:
            old = data.draw(st.integers(0, self.model.head), label="version")
            try:
                expected = self.model.restore(old, key)
            except VersionVacuumedError:
                with pytest.raises(VersionVacuumedError):
                    self.writer.restore(NAME, old, idempotency_key=key)
                return
            assert self.writer.restore(NAME, old, idempotency_key=key).version == expected

        @rule(full=st.booleans())
        def compact(self, full: bool) -> None:
            made = self.writer.compact(NAME, SMALL, full=full)
            self._compacted(tuple(r.version for r in made))

        @rule(keep_versions=st.none() | st.integers(1, 3),
              keep_days=st.none() | st.sampled_from([0.0, 365.0]), dry_run=st.booleans())
        def vacuum(self, keep_versions: int | None, keep_days: float | None,
                   dry_run: bool) -> None:
            if keep_versions is None and keep_days is None:
                keep_versions = 1
            boundary = self.model.boundary(keep_versions, keep_days)
            result = self.writer.vacuum(NAME, keep_versions=keep_versions, keep_days=keep_days,
                                        grace_seconds=0, dry_run=dry_run)
            if boundary > self.model.expired_before and not dry_run:
                assert result.record is not None
                assert result.record.version == self.model.head + 1
                self.model.expired_before = boundary
                self.model.same_rows("vacuum")
            else:
                assert result.record is None
            assert result.expired_before == max(boundary, self.model.expired_before)

        @rule()
        def collect_garbage(self) -> None:
            assert gc(self.writer, NAME, grace_seconds=0) == []

        @rule(interval=st.integers(1, 4))
        def reopen(self, interval: int) -> None:
            self.writer = self.opener(checkpoint_interval=interval)

        def _compacted(self, versions: tuple[int, ...]) -> None:
            assert list(versions) == list(range(self.model.head + 1,
                                                self.model.head + 1 + len(versions)))
            for _ in versions:
                self.model.same_rows("compact")

        @invariant()
        def writer_agrees(self) -> None:
            if self.model.versions:  # its head; every version from a fresh Store below
                check(self.model, self.writer, NAME, every_version=False)

        def teardown(self) -> None:
            """At the end of each program, every version through the writer's caches too."""
            if self.model.versions:
                check(self.model, self.writer, NAME)
                check(self.model, self.reader, NAME)

        @invariant()
        def long_lived_reader_agrees(self) -> None:
            if self.model.versions:
                check(self.model, self.reader, NAME, every_version=False)
                assert self.reader.state(NAME) == self.writer.state(NAME)

        @invariant()
        def fresh_store_agrees(self) -> None:
            if self.model.versions:
                fresh = self.opener()
                check(self.model, fresh, NAME)
                assert fresh.state(NAME) == self.writer.state(NAME)
                check_maintenance(fresh, NAME)

    return StoreMachine


def run(machine: type[RuleBasedStateMachine], examples: int, steps: int) -> None:
    """Run `examples` random programs of up to `steps` steps.

    For a longer search than CI's, DYNGEN_MODEL_SCALE=N runs N times the examples, twice
    the steps; DYNGEN_MODEL_NO_SHRINK=1 reports a failure's program unshrunk, at once.
    """
    scale = int(os.environ.get("DYNGEN_MODEL_SCALE", "1"))
    if scale > 1:
        examples, steps = examples * scale, steps * 2
    phases = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target]
    if not os.environ.get("DYNGEN_MODEL_NO_SHRINK"):
        phases.append(Phase.shrink)
    run_state_machine_as_test(machine, settings=settings(
        max_examples=examples, stateful_step_count=steps, deadline=None, phases=phases,
        suppress_health_check=list(HealthCheck), database=None))


def local_roots(tmp_path: Path) -> Callable[[], Callable[..., Store]]:
    def new_root() -> Callable[..., Store]:
        root = tmp_path / uuid.uuid4().hex
        return lambda **kw: Store(root, cache_dir=tmp_path / "cache", **kw)
    return new_root


def test_the_store_on_a_local_folder_matches_the_model(tmp_path: Path) -> None:
    run(store_machine(local_roots(tmp_path)), examples=8, steps=10)


def test_the_store_on_memory_matches_the_model(tmp_path: Path) -> None:
    import fsspec

    base = f"dyngen-model-{uuid.uuid4().hex}"

    def new_root() -> Callable[..., Store]:
        root = f"memory://{base}/{uuid.uuid4().hex}"
        return lambda **kw: Store(root, cache_dir=tmp_path / "cache", **kw)

    try:
        run(store_machine(new_root), examples=6, steps=10)
    finally:
        memory = fsspec.filesystem("memory")
        if memory.exists(base):
            memory.rm(base, recursive=True)


def test_the_store_on_s3_matches_the_model(tmp_path: Path, s3_endpoint: str) -> None:
    bucket, options = new_bucket(s3_endpoint), s3_options(s3_endpoint)

    def new_root() -> Callable[..., Store]:
        root = f"s3://{bucket}/{uuid.uuid4().hex}"
        return lambda **kw: Store(root, storage_options=options, cache_dir=tmp_path / "cache",
                                  **kw)

    run(store_machine(new_root), examples=2, steps=5)
