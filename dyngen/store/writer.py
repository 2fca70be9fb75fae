"""The store's write side: shards written, then a version record committed.

A commit is the exclusive creation of the next `_versions/<N>.json` (a durable temp
file hard-linked into place; a link never replaces an existing file). Two writers on
the same parent cannot both create N: the loser gets CommitConflictError, rebases its
pending commit on the new head and tries again. Nothing is rewritten in place. An append
may cover batch ends of the dataset's inbox: checked on its parent (covering.py), refused
whole if any was covered meanwhile.
`Store` (store.py) adds the operations built on it: append, restore, compact, vacuum.
"""

from __future__ import annotations

import json
import logging
import random
import re
import time
import uuid
from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

import numpy as np
import pyarrow as pa

from dyngen.errors import (
    CommitConflictError,
    CompactionConflictError,
    CorruptionError,
    DatasetExistsError,
    SchemaMismatchError,
    VersionVacuumedError,
)
from dyngen.faults import crash_point
from dyngen.progress import QUIET, Bar
from dyngen.store import index as near
from dyngen.store import keys as pk
from dyngen.store import shards as sh
from dyngen.store.covered import CoverageError, entry_keys
from dyngen.store.covering import check_covers, refuse_if_covered
from dyngen.store.log import VersionLog
from dyngen.store.minhash import LshParams
from dyngen.store.reader import DATA_DIR, REJECTED_DIR, REJECTED_SCHEMA, StoreReader
from dyngen.store.records import LogEntry, PendingCommit, ShardInfo, Snapshot, VersionRecord
from dyngen.store.room import reports_full_disk
from dyngen.store.state import LogState, apply, still_applies

logger = logging.getLogger(__name__)
# Sidecars are written as `round.near_duplicate`'s defaults hash them, unless told otherwise.
DEFAULT_INDEX = LshParams()
_KEY_IN_TEXT = re.compile(r'"idempotency_key": ("(?:[^"\\]|\\.)*")')


class StoreWriter(StoreReader):
    """Datasets under one root folder: writing shards and committing version records."""

    def create(self, name: str, rows: sh.Rows, *, idempotency_key: str | None = None,
               lineage: dict[str, Any] | None = None, generator: str | None = "import",
               prompt_key: str = "prompt", progress: Bar = QUIET,
               index: LshParams | None = DEFAULT_INDEX,
               vectors: near.Kind | None = None) -> VersionRecord:
        """Commit version 0 of a new dataset from `rows`, prompts in column `prompt_key`.

        `index`: how its near-duplicate sidecars are hashed (None: none are written);
        `vectors`: how its semantic sidecars are embedded (None: none are written).
        """
        table = sh.to_table(rows)
        table = sh.with_provenance(table, 0, None, generator)
        # Normalise through HF features so every later shard has the same exact schema.
        schema_json = sh.schema_to_json(table.schema)
        table = sh.conform(table, sh.schema_from_json(schema_json))
        if self.head_version(name) is not None:
            raise DatasetExistsError(
                f"dataset {name!r} already exists (head is version {self.head_version(name)}). "
                "Append to it, or choose another name."
            )
        pending = PendingCommit(
            dataset=name, parent=None, operation="create",
            new_shards=self._write_data(name, table, prompt_key, progress, index,
                                        vectors=vectors),
            schema=schema_json,
            idempotency_key=idempotency_key, lineage=dict(lineage or {}), generator=generator,
            prompt_key=prompt_key,
        )
        try:
            return self.commit(pending)
        except CommitConflictError:
            self.abort(pending)
            raise DatasetExistsError(
                f"dataset {name!r} was created by another writer meanwhile; append to it."
            ) from None

    def prepare_append(self, name: str, rows: sh.Rows, *, rejected: sh.Rows | None = None,
                       idempotency_key: str | None = None,
                       lineage: dict[str, Any] | None = None, round_id: str | None = None,
                       generator: str | None = None,
                       index: LshParams | None = DEFAULT_INDEX,
                       vectors: near.Kind | None = None,
                       covers: Iterable[Any] | None = None) -> PendingCommit:
        """Write the rows (and quarantined rows) as new shards on top of the current head;
        `index` hashes the near-duplicate sidecar of the rows' shard, `vectors` embeds its
        semantic sidecar (None: none). `covers`: the inbox's batch ends (BatchEnd objects or
        (run, step) pairs) the version covers, checked at commit (dyngen/store/covering.py)."""
        keys = entry_keys(covers or ())
        head = self.state(name)
        table = sh.with_provenance(sh.to_table(rows), head.version + 1, round_id, generator)
        schema = sh.widen(sh.schema_from_json(head.schema), table.schema)
        table = sh.conform(table, schema)
        pending = PendingCommit(
            dataset=name, parent=head.version, operation="append",
            new_shards=self._write_data(name, table, head.prompt_key, index=index,
                                        vectors=vectors),
            schema=sh.schema_to_json(schema), idempotency_key=idempotency_key,
            lineage=dict(lineage or {}), round_id=round_id, generator=generator,
            prompt_key=head.prompt_key, covers=keys,
        )
        try:
            return replace(pending, rejected=self._write_rejected(name, rejected))
        except BaseException:
            self.abort(pending)  # the data shard just written is never left behind
            raise

    @reports_full_disk
    def commit(self, pending: PendingCommit) -> VersionRecord:
        """Create the version record for `pending`, or raise CommitConflictError.

        If the idempotency key is already in the log, the existing version is returned
        and the pending shards are removed: a re-delivered round lands exactly once.
        """
        name = pending.dataset
        log = self.log(name)
        if pending.idempotency_key is not None:
            existing = self.find_idempotency_key(name, pending.idempotency_key)
            if existing is not None:
                self.abort(pending)
                return existing
        head = log.head_version()
        if head != pending.parent:
            raise CommitConflictError(name, pending.parent, head)
        parent_entry = self._readable_entry(log, head)
        if parent_entry is not None:
            self._mark_keys(log, parent_entry)  # so only the head can lack its key's marker
        try:
            entry, state = self._next(log, pending)
        except CoverageError:  # refused whole: nothing is committed, nothing left behind
            self.abort(pending)
            raise
        try:
            self.backend.write_new(log.record_rel(entry.version), entry.to_json().encode(),
                                   hook=_record_stage)
        except FileExistsError:
            raise CommitConflictError(name, pending.parent, log.head_version()) from None
        log.remember(entry)
        log.keep_state(state)
        if log.wants_checkpoint(entry, parent_entry):
            try:
                log.write_checkpoint(state)
            except Exception as exc:  # an optimisation: the version is committed regardless
                logger.warning("dyngen: checkpoint of %s v%d not written (%s); reads replay "
                               "the records instead", name, entry.version, exc)
        rec = VersionRecord.of(entry, state.shards)
        self._remember(rec)
        return rec

    def rebase(self, pending: PendingCommit) -> PendingCommit:
        """Re-target a pending commit on the current head."""
        if pending.operation == "create":
            raise DatasetExistsError(f"dataset {pending.dataset!r} already exists.")
        head = self.state(pending.dataset)
        refuse_if_covered(self, pending, head)  # covered meanwhile: not worth rewriting
        if pending.operation in ("restore", "vacuum"):
            return replace(pending, parent=head.version)
        if pending.operation == "compact":
            return self._rebase_compaction(pending, head)
        # Both sides may have added extra_info fields since their common parent.
        schema = sh.widen(sh.schema_from_json(head.schema), sh.schema_from_json(pending.schema))
        # Rows carry the version that added them, so the new shard is rewritten with the
        # new number; the old file was never committed and is removed at once.
        new_shards = []
        for info in pending.new_shards:
            table = sh.open_table(self.shard_path(pending.dataset, info)).table
            table = sh.with_provenance(table, head.version + 1, pending.round_id,
                                       pending.generator)
            try:
                table = sh.conform(table, schema)
            except SchemaMismatchError as exc:
                raise SchemaMismatchError(
                    f"dataset {pending.dataset!r} changed schema at version {head.version} in "
                    f"a way these rows do not fit ({exc}); regenerate them against the new head."
                ) from exc
            # The same prompts in the same order: the sidecars' bytes stay valid.
            lsh, vec = (None if rel is None else self.backend.read_bytes(
                self.shard_rel(pending.dataset, info, rel=rel)) for rel in (info.lsh, info.vec))
            new_shards += self._write_data(pending.dataset, table, pending.prompt_key, lsh=lsh,
                                           vec=vec)
            self.abort(replace(pending, new_shards=(info,), rejected=()))
        return replace(pending, parent=head.version, new_shards=tuple(new_shards),
                       schema=sh.schema_to_json(schema))

    def commit_with_rebase(self, pending: PendingCommit, *,
                           max_attempts: int = 200) -> VersionRecord:
        """Commit, rebasing on each conflict; give up (and clean up) after `max_attempts`."""
        for attempt in range(max_attempts):
            try:
                return self.commit(pending)
            except CommitConflictError:
                if attempt == max_attempts - 1:
                    self.abort(pending)
                    raise
                time.sleep(random.uniform(0, 0.01 * min(attempt + 1, 10)))
                pending = self.rebase(pending)
        raise AssertionError("unreachable")

    def abort(self, pending: PendingCommit) -> None:
        """Remove the shards a pending commit wrote (only ever called before it commits)."""
        written = {s.path: s for s in pending.new_shards + pending.rejected}
        written.update((s.path, s) for run in pending.runs for s in run.added)
        for info in written.values():
            for rel in info.files:
                self.backend.delete(self.shard_rel(pending.dataset, info, rel=rel))

    # ---- the next record ------------------------------------------------------------
    def _next(self, log: VersionLog, pending: PendingCommit) -> tuple[LogEntry, LogState]:
        """The record `pending` commits and the state it makes, from the parent's state."""
        parent = None if pending.parent is None else self._parent_state(log, pending)
        if pending.covers:
            check_covers(self.backend, log, pending.covers, parent)
        version = pending.version
        created = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
        added, removed, snapshot = pending.new_shards, pending.removed, None
        lineage, schema = pending.lineage, pending.schema
        if pending.operation == "restore":
            assert pending.restore_of is not None
            old = self._restorable(log, pending.restore_of, parent)
            # A restore states its whole state, so it reads even over a damaged parent.
            quarantine = parent.quarantine if parent is not None else old.quarantine
            snapshot = Snapshot(old.shards, quarantine, (parent or old).covered)
            before = {s.path for s in parent.shards} if parent is not None else set()
            added = tuple(s for s in old.shards if s.path not in before)
            removed = tuple(sorted(before - {s.path for s in old.shards}))
        elif pending.operation == "vacuum":
            retention = {**lineage["retention"], "version": version, "created_at": created}
            lineage = {**lineage, "retention": retention}
        if parent is not None and pending.operation in ("compact", "vacuum"):
            schema = parent.schema
        entry = LogEntry(
            dataset=pending.dataset, version=version, parent=pending.parent,
            operation=pending.operation, rows=0, schema=schema, created_at=created,
            idempotency_key=pending.idempotency_key, rejected=pending.rejected,
            lineage=lineage, prompt_key=pending.prompt_key, added=added, removed=removed,
            snapshot=snapshot, runs=pending.runs, covers=pending.covers,
        )
        state = apply(parent, entry)
        rows = sum(s.rows for s in state.shards)
        return replace(entry, rows=rows), replace(state, rows=rows)

    def _parent_state(self, log: VersionLog, pending: PendingCommit) -> LogState | None:
        assert pending.parent is not None
        try:
            return log.state(pending.parent)
        except CorruptionError:
            if pending.operation == "restore":
                return None  # recovering from damage: the restore carries everything
            raise

    def _restorable(self, log: VersionLog, version: int, parent: LogState | None) -> LogState:
        retention = parent.retention if parent is not None else None
        if retention is not None and version < retention.expired_before:
            raise VersionVacuumedError(
                f"cannot restore version {version} of dataset {log.dataset!r}: retention "
                f"(`{retention.describe()}`, version {retention.version}) removed the data of "
                f"versions below {retention.expired_before}.")
        return log.state(version)

    @staticmethod
    def _readable_entry(log: VersionLog, version: int | None) -> LogEntry | None:
        if version is None:
            return None
        try:
            return log.entry(version)
        except (CorruptionError, OSError):
            return None  # a damaged head: a restore on top is how one recovers

    def _mark_keys(self, log: VersionLog, parent: LogEntry) -> None:
        """Mark the parent's key; a log of format 1 gets every old key marked first."""
        if parent.format == 1:
            for version in range(parent.version):
                try:
                    found = _KEY_IN_TEXT.search(log.read_text(version))
                except (OSError, CorruptionError):
                    continue  # verify reports it; its key, if any, cannot be known
                if found is not None:
                    log.mark_key(json.loads(found.group(1)), version)
        if parent.idempotency_key is not None:
            log.mark_key(parent.idempotency_key, parent.version)

    def _rebase_compaction(self, pending: PendingCommit, head: LogState) -> PendingCommit:
        """Keep a compaction whose input shards are still in the head, in order, unchanged."""
        if not still_applies(pending.removed, head):
            self.abort(pending)
            raise CompactionConflictError(
                f"the shards a compaction of {pending.dataset!r} rewrote were changed by "
                f"version {head.version}; its output was removed. Compact again.")
        return replace(pending, parent=head.version)

    # ---- shards --------------------------------------------------------------------
    def _write_data(self, name: str, table: pa.Table, prompt_key: str,
                    progress: Bar = QUIET, index: LshParams | None = None, *,
                    lsh: bytes | None = None, vectors: near.Kind | None = None,
                    vec: bytes | None = None) -> tuple[ShardInfo, ...]:
        return (self.write_shard(name, DATA_DIR, table, prompt_key, progress=progress,
                                 index=index, lsh=lsh, vectors=vectors, vec=vec)
                if len(table) else ())

    def _write_rejected(self, name: str, rejected: sh.Rows | None) -> tuple[ShardInfo, ...]:
        if rejected is None:
            return ()
        table = sh.to_table(rejected)
        if len(table) == 0:
            return ()
        if "reason" not in table.column_names:
            raise SchemaMismatchError("rejected rows need a 'reason' column; found "
                                      f"{table.column_names}.")
        return self.write_shard(name, REJECTED_DIR, sh.conform(table, REJECTED_SCHEMA))

    @reports_full_disk
    def write_shard(self, name: str, sub: str, table: pa.Table, prompt_key: str | None = None,
                    *, keys: np.ndarray | None = None, lsh: bytes | None = None,
                    index: LshParams | None = None, vec: bytes | None = None,
                    vectors: near.Kind | None = None,
                    progress: Bar = QUIET) -> tuple[ShardInfo, ...]:
        """Write a new shard (with its sorted prompt keys and, given `index` or `lsh`, its
        near-duplicate sidecar; given `vectors` or `vec`, its semantic sidecar) under
        `sub`/ of a dataset.

        The shard's own files come first, the shard last; if any write fails (a full disk)
        the files already written are removed: they are named by no pending commit.
        """
        stem = f"{sub}/{uuid.uuid4().hex}"
        has_prompts = prompt_key is not None and prompt_key in table.column_names
        prompts = None
        if has_prompts and (keys is None or (lsh is None and index is not None)
                            or (vec is None and vectors is not None)):
            prompts = table.column(prompt_key).to_pylist()
        if keys is None and prompts is not None:
            progress.stage("hashing prompts for dedup", len(table), "rows")
            keys = pk.prompt_keys(prompts, progress)
        if lsh is None and index is not None and prompts is not None:
            progress.stage("hashing prompts for near-duplicates", len(table), "rows")
            lsh = near.sidecar_bytes(prompts, index, progress)
        if vec is None and vectors is not None and prompts is not None:
            progress.stage("embedding prompts for semantic duplicates", len(table), "rows")
            vec = vectors.build(prompts, progress)
        written: list[str] = []
        try:
            keys_rel = self._write_beside(name, f"{stem}.keys", written,
                                          None if keys is None else pk.sorted_bytes(keys))
            lsh_rel = self._write_beside(name, f"{stem}.lsh", written, lsh)
            vec_rel = self._write_beside(name, f"{stem}.vec", written, vec)
            if lsh_rel is not None or vec_rel is not None:
                crash_point("store.after_sidecar_write")
            progress.stage(f"writing {len(table):,} rows as a shard")
            info = sh.write_shard(self.backend, f"{name}/{stem}.arrow", table)
        except BaseException:
            for rel in written:
                self.backend.delete(f"{name}/{rel}")
            raise
        crash_point("store.after_shard_write")
        return (replace(info, keys=keys_rel, lsh=lsh_rel, vec=vec_rel),)

    def _write_beside(self, name: str, rel: str, written: list[str],
                      data: bytes | None) -> str | None:
        """Write one of a shard's own files (if there is one), remembering it for cleanup."""
        if data is None:
            return None
        written.append(rel)  # before the write: a failed write may leave the file
        self.backend.write_new(f"{name}/{rel}", data)
        return rel


def _record_stage(stage: str) -> None:
    """Crash points of the commit itself: the record's temp file, then its link."""
    if stage == "written":
        crash_point("store.after_temp_record")
        crash_point("store.before_link")
    else:
        crash_point("store.after_link")
