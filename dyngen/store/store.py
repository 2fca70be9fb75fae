"""The versioned dataset store: append-only shards plus a linear log of version records.

`Store` is the store as users and rounds use it: the read side (reader.py), the write side
(writer.py: shards, commits, rebases) and the operations built on them here: `append` (a
commit, then the head's small shards compacted), `restore`, `compact` (compaction.py) and
`vacuum` (retention.py); and the dataset's inbox of batch ends (inbox.py), which versions
cover (`append(covers=...)`, covering.py): what no version covers yet is `pending`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from dyngen.errors import ConfigError
from dyngen.store import inbox
from dyngen.store import shards as sh
from dyngen.store.compaction import CompactionPolicy, compact
from dyngen.store.covered import EMPTY, check_run, check_step
from dyngen.store.covering import covering_version
from dyngen.store.inbox import BatchEnd
from dyngen.store.index import Kind
from dyngen.store.log import VERSIONS_DIR
from dyngen.store.minhash import LshParams
from dyngen.store.reader import DATA_DIR, REJECTED_DIR, REJECTED_SCHEMA
from dyngen.store.records import PendingCommit, VersionRecord
from dyngen.store.retention import VacuumResult, vacuum
from dyngen.store.writer import DEFAULT_INDEX, StoreWriter

__all__ = ["DATA_DIR", "DEFAULT_INDEX", "REJECTED_DIR", "REJECTED_SCHEMA", "VERSIONS_DIR",
           "BatchEnd", "PendingCommit", "Store"]

logger = logging.getLogger(__name__)


class Store(StoreWriter):
    """Datasets under one root folder, each a log of immutable versions."""

    def append(self, name: str, rows: sh.Rows, *, rejected: sh.Rows | None = None,
               idempotency_key: str | None = None, lineage: dict[str, Any] | None = None,
               compact: bool | CompactionPolicy = True, round_id: str | None = None,
               generator: str | None = None,
               index: LshParams | None = DEFAULT_INDEX,
               vectors: Kind | None = None,
               covers: Iterable[Any] | None = None) -> VersionRecord:
        """Append rows as a new version, rebasing over concurrent commits; returns its record.

        `rows` and `rejected` (quarantined rows, each with a `reason`): a datasets.Dataset,
        an Arrow table, a list of dicts (columns: every key of every row) or a dict of
        lists. `idempotency_key`: if a version already committed it, that version's record
        is returned and nothing is appended. `lineage`: a JSON-able mapping kept in the
        record. `round_id` and `generator` fill the rows' provenance columns; `index` hashes
        the rows' near-duplicate sidecar (None: none), `vectors` embeds their semantic
        sidecar (a `dyngen.store.semantic.VecKind`; None: none). `covers`: the inbox's batch
        ends this version covers (`pending`'s list, or (run, step) pairs); if a version
        committed meanwhile covers any of them, AlreadyCoveredError and nothing is committed.

        Then, as a round does, the head's small shards are compacted by the default policy
        (`compact`: a CompactionPolicy of your own, or False for none), so a loop of appends
        keeps the head's shards, and so its checkpoints, small. The head may then be a
        later `compact` version: the returned record's `compactions` lists the versions
        that compaction committed (empty if none). A failed compaction only warns: the
        append is committed.
        """
        policy = _append_policy(compact)
        pending = self.prepare_append(name, rows, rejected=rejected,
                                      idempotency_key=idempotency_key, lineage=lineage,
                                      round_id=round_id, generator=generator, index=index,
                                      vectors=vectors, covers=covers)
        try:
            record = self.commit_with_rebase(pending)
        except BaseException:
            self.abort(pending)
            raise
        if policy is None:
            return record
        try:
            made = self.compact(name, policy)
        except Exception as exc:  # the rows are committed; compaction can wait
            logger.warning("dyngen: compacting %s after appending version %d failed "
                           "(the version is committed): %s", name, record.version, exc)
            return record
        return replace(record, compactions=tuple(r.version for r in made))

    def restore(self, name: str, version: int, *,
                idempotency_key: str | None = None) -> VersionRecord:
        """Commit a new version whose rows are exactly those of `version`."""
        old = self.record(name, version)
        pending = PendingCommit(
            # The head's number comes from the log, not its record, so restore also
            # recovers from a damaged newest record.
            dataset=name, parent=self.head_version(name), operation="restore",
            restore_of=version, schema=old.schema, idempotency_key=idempotency_key,
            lineage={"restored_from": version}, prompt_key=old.prompt_key,
        )
        return self.commit_with_rebase(pending)

    def compact(self, name: str, policy: CompactionPolicy | None = None, *,
                full: bool = False) -> list[VersionRecord]:
        """Rewrite small shards into large ones as `compact` versions (same rows, same order)."""
        return compact(self, name, policy, full=full)

    def vacuum(self, name: str, *, keep_versions: int | None = None,
               keep_days: float | None = None, grace_seconds: float | None = None,
               dry_run: bool = False) -> VacuumResult:
        """Retention: delete data files that no kept version (or round in flight) names."""
        return vacuum(self, name, keep_versions=keep_versions, keep_days=keep_days,
                      grace_seconds=grace_seconds, dry_run=dry_run)


    # ---- the inbox ------------------------------------------------------------------
    def write_batch_end(self, name: str, run: str, step: int,
                        metrics: Mapping[str, float] | None = None, rollouts: Any = None, *,
                        event_id: str | None = None) -> BatchEnd:
        """Write a training run's batch end into the dataset's inbox; the entry kept.

        Created exclusively: if (run, step) has an entry already, it is kept and returned
        (`created` False; `differs` names the fields this call's differ in). `metrics`:
        names to finite numbers. `rollouts`: a list of JSON values (inline when small), an
        Arrow table or Dataset, or the path of a local JSONL file; large ones are written
        into the store beside the entry, so a round on any host reads them.
        """
        return inbox.write_batch_end(self.backend, name, run, step, metrics, rollouts,
                                     event_id=event_id)

    def batch_end(self, name: str, run: str, step: int) -> BatchEnd | None:
        """The inbox entry of (run, step), or None."""
        return inbox.read_entry(self.backend, name, check_run(run), check_step(step))

    def batch_ends(self, name: str) -> list[BatchEnd]:
        """Every entry of the dataset's inbox, by (run, step)."""
        return inbox.entries(self.backend, name)

    def pending(self, name: str, version: int | None = None) -> list[BatchEnd]:
        """The inbox entries no version up to `version` (the head by default) covers, by
        (run, step); for a dataset with no version yet, every entry."""
        if version is None and self.head_version(name) is None:
            return inbox.entries(self.backend, name, EMPTY)
        return inbox.entries(self.backend, name, self.state(name, version).covered)

    def pending_keys(self, name: str, version: int) -> list[tuple[str, int]]:
        """(run, step) of each inbox entry no version up to `version` covers, ascending;
        listed, not read."""
        return inbox.entry_keys(self.backend, name, self.state(name, version).covered)

    def covering_version(self, name: str, run: str, step: int,
                         version: int | None = None) -> int | None:
        """The version (up to `version`, the head by default) that covers (run, step)."""
        at = self._version(name, version)
        return covering_version(self.log(name), (check_run(run), check_step(step)), at)

    def read_rollouts(self, entry: BatchEnd) -> list[Any]:
        """A batch end's rollouts, read from the store (checked against the entry's hash)."""
        return inbox.read_rollouts(self.backend, entry)

    def rollouts_bytes(self, entry: BatchEnd) -> bytes:
        """A batch end's rollouts as JSONL bytes, one rollout per line."""
        return inbox.rollouts_bytes(self.backend, entry)


def _append_policy(compact: bool | CompactionPolicy) -> CompactionPolicy | None:
    """The policy `Store.append(compact=...)` names: True the default one, False none."""
    if isinstance(compact, CompactionPolicy):
        return compact
    if isinstance(compact, bool):
        return CompactionPolicy() if compact else None
    raise ConfigError(f"append: compact expects True, False or a CompactionPolicy, found "
                      f"{compact!r}.")
