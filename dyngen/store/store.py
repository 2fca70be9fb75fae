"""The versioned dataset store: append-only shards plus a log of immutable version records.

A commit is the exclusive creation of the next `_versions/<N>.json` (a durable temp
file hard-linked into place; a link never replaces an existing file). Two writers on
the same parent cannot both create N: the loser gets CommitConflictError, rebases its
pending commit on the new head and tries again. Nothing is rewritten in place.
"""

from __future__ import annotations

import json
import os
import random
import re
import time
import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa

from dyngen.errors import (
    CommitConflictError,
    CorruptionError,
    DatasetExistsError,
    DatasetNotFoundError,
    SchemaMismatchError,
    VersionNotFoundError,
)
from dyngen.faults import crash_point
from dyngen.progress import QUIET, Bar
from dyngen.store import keys as pk
from dyngen.store import shards as sh
from dyngen.store.names import validate_name
from dyngen.store.records import ShardInfo, VersionRecord

DATA_DIR = "data"
REJECTED_DIR = "rejected"
VERSIONS_DIR = "_versions"
_RECORD_NAME = re.compile(r"(\d{20})\.json")
_SHARD_PATH = re.compile(rf"({DATA_DIR}|{REJECTED_DIR})/[A-Za-z0-9_-]+\.(arrow|keys)")
REJECTED_SCHEMA = pa.schema([("reason", pa.string()), ("detail", pa.string()),
                             ("row", pa.string())])


@dataclass(frozen=True)
class PendingCommit:
    """Shards written but not yet committed, and the parent the commit expects."""

    dataset: str
    parent: int | None
    operation: str
    base_shards: tuple[ShardInfo, ...]
    new_shards: tuple[ShardInfo, ...] = ()
    rejected: tuple[ShardInfo, ...] = ()
    schema: dict[str, Any] = field(default_factory=dict)
    idempotency_key: str | None = None
    lineage: dict[str, Any] = field(default_factory=dict)
    round_id: str | None = None
    generator: str | None = None
    prompt_key: str = "prompt"

    @property
    def version(self) -> int:
        """The version number this commit will create if it wins."""
        return 0 if self.parent is None else self.parent + 1


class Store:
    """Datasets under one root folder, each a log of immutable versions."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).resolve()
        self._records: dict[tuple[str, int], VersionRecord] = {}

    # ---- paths -------------------------------------------------------------------
    def dataset_dir(self, name: str) -> Path:
        """The folder of dataset `name` (validated: always a direct child of the root)."""
        return self.root / validate_name(name)

    def shard_path(self, name: str, info: ShardInfo, version: int | None = None, *,
                   rel: str | None = None) -> Path:
        """Absolute path of a shard (or its file `rel`), refusing anything outside the dataset."""
        rel = info.path if rel is None else rel
        if not _SHARD_PATH.fullmatch(rel):
            where = f"version {version}" if version is not None else "a record"
            raise CorruptionError(
                f"{where} of dataset {name!r} names shard {rel!r}, which is outside the "
                f"dataset's {DATA_DIR}/ and {REJECTED_DIR}/ folders; the record was tampered "
                "with"
            )
        return self.dataset_dir(name) / rel

    def list_datasets(self) -> list[str]:
        """Names of the datasets under the root that have a version log."""
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if (p / VERSIONS_DIR).is_dir())

    # ---- reading -------------------------------------------------------------------
    def versions(self, name: str) -> list[int]:
        """Committed version numbers, ascending."""
        folder = self.dataset_dir(name) / VERSIONS_DIR
        if not folder.is_dir():
            return []
        found = (_RECORD_NAME.fullmatch(n) for n in os.listdir(folder))
        return sorted(int(m.group(1)) for m in found if m)

    def head_version(self, name: str) -> int | None:
        """The newest committed version number, or None if the dataset has none."""
        numbers = self.versions(name)
        return numbers[-1] if numbers else None

    def record(self, name: str, version: int) -> VersionRecord:
        """The record of one version (records are immutable, so they are cached)."""
        cached = self._records.get((name, version))
        if cached is not None:
            return cached
        path = self.dataset_dir(name) / VERSIONS_DIR / f"{version:020d}.json"
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            known = self.versions(name)
            if not known:
                raise self._not_found(name) from None
            raise VersionNotFoundError(
                f"dataset {name!r} has no version {version}; versions are "
                f"{known[0]}..{known[-1]}. Run `dyngen log {name}` to see them."
            ) from None
        except UnicodeDecodeError as exc:
            raise CorruptionError(f"version record {path} is not UTF-8 text (byte {exc.start}); "
                                  "run `dyngen verify`.") from None
        rec = VersionRecord.from_json(text, str(path))
        if rec.version != version or rec.dataset != name:
            raise CorruptionError(
                f"version record {path} says it is version {rec.version} of {rec.dataset!r}; "
                f"expected version {version} of {name!r}."
            )
        self._records[(name, version)] = rec
        return rec

    def head(self, name: str) -> VersionRecord:
        """The record of the newest committed version."""
        version = self.head_version(name)
        if version is None:
            raise self._not_found(name)
        return self.record(name, version)

    def history(self, name: str, newest: int | None = None) -> list[VersionRecord]:
        """Every version record (or the `newest` ones), oldest first."""
        numbers = self.versions(name)
        if not numbers:
            raise self._not_found(name)
        return [self.record(name, v) for v in numbers[-newest if newest else 0:]]

    def load(self, name: str, version: int | None = None, *,
             verify_checksums: bool = True) -> datasets.Dataset:
        """Memory-map the shards of a version (the head by default) as one Dataset."""
        rec = self.head(name) if version is None else self.record(name, version)
        return self._open(name, rec, rec.shards, verify_checksums)

    def load_rejected(self, name: str, version: int | None = None, *,
                      round_only: bool = False) -> datasets.Dataset:
        """Quarantined rows of every round up to `version` (or, with `round_only`, of the
        round that made it), with their reasons."""
        head = self.head(name) if version is None else self.record(name, version)
        recs = [head] if round_only else [self.record(name, v) for v in self.versions(name)
                                          if v <= head.version]
        infos = tuple(s for r in recs for s in r.rejected)
        return self._open(name, head, infos, True, schema=REJECTED_SCHEMA)

    def _open(self, name: str, rec: VersionRecord, infos: tuple[ShardInfo, ...],
              verify_checksums: bool, schema: pa.Schema | None = None) -> datasets.Dataset:
        parts = []
        for info in infos:
            try:
                path = self.shard_path(name, info, rec.version)
                problem = sh.check_shard(path, info, checksum=verify_checksums)
            except CorruptionError as exc:
                problem = str(exc)
            if problem is None:
                try:
                    parts.append(sh.read_shard(path))
                    continue
                except (OSError, pa.ArrowException) as exc:
                    problem = f"shard {info.path} is unreadable ({exc})"
            raise CorruptionError(
                f"cannot load version {rec.version} of dataset {name!r}: {problem}. "
                f"Run `dyngen verify {name}` to list all damage, then `dyngen restore {name} "
                "<version>` to an earlier version that verifies, and `dyngen gc`."
            )
        target = schema if schema is not None else sh.schema_from_json(rec.schema)
        if not parts:
            return datasets.Dataset(datasets.table.InMemoryTable(target.empty_table()))
        # Shards written before a round added extra_info fields read them as null.
        parts = [sh.as_schema(p, target) for p in parts]
        return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)

    def contains_prompts(self, name: str, keys: np.ndarray,
                         version: int | None = None) -> np.ndarray:
        """Which prompt keys (see `dyngen.store.keys`) some row of a version already has."""
        rec = self.head(name) if version is None else self.record(name, version)
        found = np.zeros(len(keys), dtype=bool)
        if len(keys) == 0:
            return found
        for info in rec.shards:
            if info.keys is None:  # a shard of a dataset without a prompt column
                continue
            path = self.shard_path(name, info, rec.version, rel=info.keys)
            try:
                found |= pk.contains(path, keys)
            except (OSError, ValueError) as exc:
                raise CorruptionError(
                    f"prompt keys {info.keys} of version {rec.version} of dataset {name!r} are "
                    f"unreadable ({exc}). Run `dyngen verify {name}`."
                ) from exc
        return found

    # ---- writing -------------------------------------------------------------------
    def create(self, name: str, rows: sh.Rows, *, idempotency_key: str | None = None,
               lineage: dict[str, Any] | None = None, generator: str | None = "import",
               prompt_key: str = "prompt", progress: Bar = QUIET) -> VersionRecord:
        """Commit version 0 of a new dataset from `rows`, prompts in column `prompt_key`."""
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
            dataset=name, parent=None, operation="create", base_shards=(),
            new_shards=self._write_data(name, table, prompt_key, progress), schema=schema_json,
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
                       generator: str | None = None) -> PendingCommit:
        """Write the rows (and quarantined rows) as new shards on top of the current head."""
        head = self.head(name)
        table = sh.with_provenance(sh.to_table(rows), head.version + 1, round_id, generator)
        schema = sh.widen(sh.schema_from_json(head.schema), table.schema)
        table = sh.conform(table, schema)
        pending = PendingCommit(
            dataset=name, parent=head.version, operation="append", base_shards=head.shards,
            new_shards=self._write_data(name, table, head.prompt_key),
            schema=sh.schema_to_json(schema), idempotency_key=idempotency_key,
            lineage=dict(lineage or {}), round_id=round_id, generator=generator,
            prompt_key=head.prompt_key,
        )
        try:
            return replace(pending, rejected=self._write_rejected(name, rejected))
        except BaseException:
            self.abort(pending)  # the data shard just written is never left behind
            raise

    def commit(self, pending: PendingCommit) -> VersionRecord:
        """Create the version record for `pending`, or raise CommitConflictError.

        If the idempotency key is already in the log, the existing version is returned
        and the pending shards are removed: a re-delivered round lands exactly once.
        """
        name = pending.dataset
        if pending.idempotency_key is not None:
            existing = self.find_idempotency_key(name, pending.idempotency_key)
            if existing is not None:
                self.abort(pending)
                return existing
        head = self.head_version(name)
        if head != pending.parent:
            raise CommitConflictError(name, pending.parent, head)
        shard_list = pending.base_shards + pending.new_shards
        rec = VersionRecord(
            dataset=name, version=pending.version, parent=pending.parent,
            operation=pending.operation, shards=shard_list,
            rows=sum(s.rows for s in shard_list), schema=pending.schema,
            created_at=datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
            idempotency_key=pending.idempotency_key, rejected=pending.rejected,
            lineage=pending.lineage, prompt_key=pending.prompt_key,
        )
        folder = self.dataset_dir(name) / VERSIONS_DIR
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".tmp-{uuid.uuid4().hex}.json"
        with open(tmp, "x", encoding="utf-8") as fh:
            fh.write(rec.to_json())
            fh.flush()
            os.fsync(fh.fileno())
        crash_point("store.after_temp_record")
        try:
            crash_point("store.before_link")
            os.link(tmp, folder / f"{rec.version:020d}.json")
            crash_point("store.after_link")
        except FileExistsError:
            raise CommitConflictError(name, pending.parent, self.head_version(name)) from None
        finally:
            tmp.unlink()
        _fsync_dir(folder)
        self._records[(name, rec.version)] = rec
        return rec

    def rebase(self, pending: PendingCommit) -> PendingCommit:
        """Re-target a pending append or restore on the current head."""
        if pending.operation == "create":
            raise DatasetExistsError(f"dataset {pending.dataset!r} already exists.")
        head = self.head(pending.dataset)
        if pending.operation == "restore":
            return replace(pending, parent=head.version)
        # Both sides may have added extra_info fields since their common parent.
        schema = sh.widen(sh.schema_from_json(head.schema), sh.schema_from_json(pending.schema))
        # Rows carry the version that added them, so the new shard is rewritten with the
        # new number; the old file was never committed and is removed at once.
        new_shards = []
        for info in pending.new_shards:
            path = self.shard_path(pending.dataset, info)
            table = sh.read_shard(path).with_format("arrow")[:]
            table = sh.with_provenance(table, head.version + 1, pending.round_id,
                                       pending.generator)
            try:
                table = sh.conform(table, schema)
            except SchemaMismatchError as exc:
                raise SchemaMismatchError(
                    f"dataset {pending.dataset!r} changed schema at version {head.version} in "
                    f"a way these rows do not fit ({exc}); regenerate them against the new head."
                ) from exc
            new_shards += self._write_data(pending.dataset, table, pending.prompt_key)
            self.abort(replace(pending, new_shards=(info,), rejected=()))
        return replace(pending, parent=head.version, base_shards=head.shards,
                       new_shards=tuple(new_shards), schema=sh.schema_to_json(schema))

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

    def append(self, name: str, rows: sh.Rows, **kwargs: Any) -> VersionRecord:
        """Append rows as a new version, rebasing over concurrent commits."""
        pending = self.prepare_append(name, rows, **kwargs)
        try:
            return self.commit_with_rebase(pending)
        except BaseException:
            self.abort(pending)
            raise

    def restore(self, name: str, version: int, *,
                idempotency_key: str | None = None) -> VersionRecord:
        """Commit a new version whose rows are exactly those of `version`."""
        old = self.record(name, version)
        pending = PendingCommit(
            # The head's number comes from the log listing, not its record, so restore also
            # recovers from a damaged newest record.
            dataset=name, parent=self.head_version(name), operation="restore",
            base_shards=old.shards, schema=old.schema, idempotency_key=idempotency_key,
            lineage={"restored_from": version}, prompt_key=old.prompt_key,
        )
        return self.commit_with_rebase(pending)

    def abort(self, pending: PendingCommit) -> None:
        """Remove a pending commit's shards (only ever called before they are committed)."""
        for info in pending.new_shards + pending.rejected:
            for rel in info.files:
                self.shard_path(pending.dataset, info, rel=rel).unlink(missing_ok=True)

    def find_idempotency_key(self, name: str, key: str) -> VersionRecord | None:
        """The version committed with `key`, if any.

        Every round asks, and each record lists all shards of its version, so only the
        records whose text names the key (or that are not whole) are parsed.
        """
        needle = f'"idempotency_key": {json.dumps(key)}'
        folder = self.dataset_dir(name) / VERSIONS_DIR
        for v in reversed(self.versions(name)):
            if (name, v) not in self._records:
                try:
                    text = (folder / f"{v:020d}.json").read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError):
                    text = ""  # record() below says what is wrong
                if needle not in text and text.endswith("}\n"):
                    continue
            rec = self.record(name, v)
            if rec.idempotency_key == key:
                return rec
        return None

    # ---- helpers -------------------------------------------------------------------
    def _write_data(self, name: str, table: pa.Table, prompt_key: str,
                    progress: Bar = QUIET) -> tuple[ShardInfo, ...]:
        return self._write(name, DATA_DIR, table, prompt_key, progress) if len(table) else ()

    def _write_rejected(self, name: str, rejected: sh.Rows | None) -> tuple[ShardInfo, ...]:
        if rejected is None:
            return ()
        table = sh.to_table(rejected)
        if len(table) == 0:
            return ()
        if "reason" not in table.column_names:
            raise SchemaMismatchError("rejected rows need a 'reason' column; found "
                                      f"{table.column_names}.")
        return self._write(name, REJECTED_DIR, sh.conform(table, REJECTED_SCHEMA))

    def _write(self, name: str, sub: str, table: pa.Table, prompt_key: str | None = None,
               progress: Bar = QUIET) -> tuple[ShardInfo, ...]:
        base = self.dataset_dir(name)
        (base / sub).mkdir(parents=True, exist_ok=True)
        stem = f"{sub}/{uuid.uuid4().hex}"
        keys_rel = None
        if prompt_key is not None and prompt_key in table.column_names:
            keys_rel = f"{stem}.keys"
            progress.stage("hashing prompts for dedup", len(table), "rows")
            pk.write_keys(pk.prompt_keys(table.column(prompt_key).to_pylist(), progress),
                          base / keys_rel)
        progress.stage(f"writing {len(table):,} rows as a shard")
        info = sh.write_shard(table, base / f"{stem}.arrow")
        crash_point("store.after_shard_write")
        return (replace(info, path=f"{stem}.arrow", keys=keys_rel),)

    @staticmethod
    def _not_found(name: str) -> DatasetNotFoundError:
        return DatasetNotFoundError(
            f"dataset {name!r} has no committed version. Create it with "
            f"`dyngen import {name} <files>`, or check the store root."
        )


def _fsync_dir(folder: Path) -> None:
    """Make a directory entry durable (a no-op where the platform cannot)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
