"""Reading the store: versions, records, rows, prompt keys and idempotency keys.

Every read goes through a dataset's `VersionLog` (records, checkpoints, markers) and
the store's backend (files); a version's rows are its shards memory-mapped, and a shard
this process opened before is not opened again.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pyarrow as pa

from dyngen.errors import (
    CorruptionError,
    DatasetNotFoundError,
    VersionNotFoundError,
    VersionVacuumedError,
)
from dyngen.store import keys as pk
from dyngen.store import shards as sh
from dyngen.store.backend import Backend
from dyngen.store.location import open_backend, store_settings
from dyngen.store.log import DEFAULT_CHECKPOINT_INTERVAL, VERSIONS_DIR, VersionLog
from dyngen.store.names import validate_name
from dyngen.store.records import LogEntry, ShardInfo, VersionRecord
from dyngen.store.state import LogState

DATA_DIR = "data"
REJECTED_DIR = "rejected"
_SHARD_PATH = re.compile(rf"({DATA_DIR}|{REJECTED_DIR})/[A-Za-z0-9_-]+\.(arrow|keys|lsh|vec)")
REJECTED_SCHEMA = pa.schema([("reason", pa.string()), ("detail", pa.string()),
                             ("row", pa.string())])
_RECORD_CACHE = 1024
_R = TypeVar("_R", bound="StoreReader")

if TYPE_CHECKING:
    import datasets
    from datasets.table import MemoryMappedTable


class StoreReader:
    """Datasets under one root folder, each a log of immutable versions: the read side."""

    def __init__(self, root: str | os.PathLike[str], *,
                 checkpoint_interval: int = DEFAULT_CHECKPOINT_INTERVAL,
                 storage_options: Mapping[str, Any] | None = None,
                 single_writer: bool = False,
                 cache_dir: str | os.PathLike[str] | None = None) -> None:
        if isinstance(checkpoint_interval, bool) or not isinstance(checkpoint_interval, int) \
                or checkpoint_interval < 1:
            raise ValueError(f"checkpoint_interval: expected an integer >= 1, found "
                             f"{checkpoint_interval!r}")
        self.backend: Backend = open_backend(root, storage_options=storage_options,
                                             single_writer=single_writer, cache_dir=cache_dir)
        # A local folder (Path), or the store's URL (str) on object storage.
        self.root: Path | str = self.backend.root
        self.checkpoint_interval = checkpoint_interval
        self._logs: dict[str, VersionLog] = {}
        self._records: OrderedDict[tuple[str, int], VersionRecord] = OrderedDict()

    @classmethod
    def from_config(cls: type[_R], store: Any, **kwargs: Any) -> _R:
        """The store a config's `store` section, a `store_settings` dict or a root names."""
        return cls(**store_settings(store), **kwargs)

    def fresh(self) -> StoreReader:
        """A reader of the same store without this one's caches (reads what is there now)."""
        reader = StoreReader.__new__(StoreReader)
        reader.backend, reader.root = self.backend, self.root
        reader.checkpoint_interval = self.checkpoint_interval
        reader._logs, reader._records = {}, OrderedDict()
        return reader

    # ---- paths -------------------------------------------------------------------
    def dataset_dir(self, name: str) -> Path | str:
        """The folder of dataset `name` (validated: always a direct child of the root): a
        Path on a local store, the folder's URL on a remote one."""
        if isinstance(self.root, Path):
            return self.root / validate_name(name)
        return self.backend.describe(validate_name(name))

    def dataset_exists(self, name: str) -> bool:
        """Whether the root holds a folder for dataset `name` (committed or damaged)."""
        name = validate_name(name)
        return bool(self.backend.list_dirs(name) or self.backend.list(name))

    def shard_path(self, name: str, info: ShardInfo, version: int | None = None, *,
                   rel: str | None = None) -> Path:
        """A local path of a shard (or its file `rel`) to memory-map: the file itself, or its
        copy in the shard cache for a remote store; refuses anything outside the dataset."""
        where = self.shard_rel(name, info, version, rel=rel)
        if rel is None or rel == info.path:
            return self.backend.local_copy(where, sha256=info.sha256, size=info.bytes)
        # A shard's prompt-key or sidecar file: named by the shard's hash and its own name
        # (a key file's size is known; a sidecar's header says its own).
        return self.backend.local_copy(where, size=8 * info.rows if rel == info.keys else None,
                                       name=f"{info.sha256}-{rel.rsplit('/', 1)[-1]}")

    def shard_rel(self, name: str, info: ShardInfo, version: int | None = None, *,
                  rel: str | None = None) -> str:
        """A shard's (or its file `rel`'s) path relative to the root, checked like shard_path."""
        rel = info.path if rel is None else rel
        if not _SHARD_PATH.fullmatch(rel):
            where = f"version {version}" if version is not None else "a record"
            raise CorruptionError(
                f"{where} of dataset {name!r} names shard {rel!r}, which is outside the "
                f"dataset's {DATA_DIR}/ and {REJECTED_DIR}/ folders; the record was tampered "
                "with"
            )
        return f"{validate_name(name)}/{rel}"

    def list_datasets(self) -> list[str]:
        """Names of the datasets under the root that have a version log."""
        return sorted(name for name in self.backend.list_dirs("")
                      if VERSIONS_DIR in self.backend.list_dirs(name))

    def log(self, name: str) -> VersionLog:
        """The version log of dataset `name` (one per dataset and Store, with its caches)."""
        found = self._logs.get(name)
        if found is None:
            found = VersionLog(self.backend, validate_name(name), self.checkpoint_interval)
            self._logs[name] = found
        return found

    # ---- versions and records ---------------------------------------------------------
    def versions(self, name: str) -> list[int]:
        """Committed version numbers, ascending."""
        return self.log(name).versions()

    def head_version(self, name: str) -> int | None:
        """The newest committed version number, or None if the dataset has none."""
        return self.log(name).head_version()

    def record(self, name: str, version: int) -> VersionRecord:
        """The record of one version, with the full list of its shards."""
        cached = self._records.get((name, version))
        if cached is not None:
            return cached
        log = self.log(name)
        try:
            entry = log.entry(version)
        except FileNotFoundError:
            head = log.head_version()
            if head is None:
                raise self._not_found(name) from None
            raise VersionNotFoundError(
                f"dataset {name!r} has no version {version}; versions are 0..{head}. "
                f"Run `dyngen log {name}` to see them."
            ) from None
        rec = VersionRecord.of(entry, log.state(version).shards)
        self._remember(rec)
        return rec

    def head(self, name: str) -> VersionRecord:
        """The record of the newest committed version."""
        version = self.head_version(name)
        if version is None:
            raise self._not_found(name)
        return self.record(name, version)

    def history(self, name: str, newest: int | None = None) -> list[VersionRecord]:
        """Every version record (or the `newest` ones), oldest first."""
        log = self.log(name)
        head = log.head_version()
        if head is None:
            raise self._not_found(name)
        first = max(0, head - newest + 1) if newest else 0
        return [VersionRecord.of(entry, state.shards) for entry, state in log.replay(first, head)]

    def entries(self, name: str, *, limit: int | None = None,
                oldest_first: bool = False) -> Iterator[LogEntry]:
        """The newest `limit` records (all if None) as stored, newest first; streamed."""
        log = self.log(name)
        head = log.head_version()
        if head is None:
            raise self._not_found(name)
        first = 0 if limit is None else max(0, head - limit + 1)
        order = range(first, head + 1) if oldest_first else range(head, first - 1, -1)
        for version in order:
            yield log.entry(version)

    def state(self, name: str, version: int | None = None) -> LogState:
        """The full state of a version (the head by default): shards, quarantine, retention."""
        version = self._version(name, version)
        self.record(name, version)  # a version that does not exist is refused by name
        return self.log(name).state(version)

    def extends(self, name: str, old: int, new: int) -> bool:
        """Whether version `new` holds version `old`'s rows first, in order, then others.

        Appends add rows at the end; compaction and retention keep rows and their order;
        a restore sets other rows. Reads the records between the two.
        """
        if new < old:
            return False
        log = self.log(name)
        return all(log.entry(v).operation != "restore" for v in range(old + 1, new + 1))

    def newest_by_generator(self, name: str, generator_class: str,
                            at: int | None = None) -> VersionRecord | None:
        """The newest version up to `at` (default head) that `generator_class` made."""
        version = self.state(name, at).generators.get(generator_class)
        return None if version is None else self.record(name, version)

    # ---- rows ------------------------------------------------------------------------
    def load(self, name: str, version: int | None = None, *,
             verify_checksums: bool = True) -> datasets.Dataset:
        """Memory-map the shards of a version (the head by default) as one Dataset."""
        state = self._loadable_state(name, version)
        return self._open(name, state, state.shards, verify_checksums,
                          sh.schema_from_json(state.schema))

    def load_rejected(self, name: str, version: int | None = None, *,
                      round_only: bool = False) -> datasets.Dataset:
        """Quarantined rows of every round up to `version` (or, with `round_only`, of the
        round that made it), with their reasons."""
        state = self._loadable_state(name, version)
        infos = self.log(name).entry(state.version).rejected if round_only else state.quarantine
        return self._open(name, state, infos, True, REJECTED_SCHEMA)

    def to_arrow(self, name: str, version: int | None = None, *,
                 verify_checksums: bool = True) -> pa.Table:
        """A version's rows (the head by default) as one Arrow table over the memory-mapped
        shards: no row is copied, so DuckDB and Polars query it in place.

        Shards written before a round added extra_info fields read them as null (only
        that column of those shards is rebuilt; its leaves stay mapped).
        """
        state = self._loadable_state(name, version)
        schema = sh.schema_from_json(state.schema)
        tables = [t.table for t in self._mapped(name, state, state.shards, verify_checksums)]
        parts = [t if t.schema.equals(schema, check_metadata=False) else t.cast(schema)
                 for t in tables]
        return pa.concat_tables(parts) if parts else schema.empty_table()

    def _open(self, name: str, state: LogState, infos: tuple[ShardInfo, ...],
              verify_checksums: bool, schema: pa.Schema) -> datasets.Dataset:
        tables = self._mapped(name, state, infos, verify_checksums)
        identity = "|".join([name, str(schema), *(i.sha256 for i in infos)])
        fingerprint = hashlib.blake2b(identity.encode(), digest_size=8).hexdigest()
        return sh.as_dataset(tables, schema, fingerprint)

    def _mapped(self, name: str, state: LogState, infos: tuple[ShardInfo, ...],
                verify_checksums: bool) -> list[MemoryMappedTable]:
        """The shards `infos` of a version, each checked and memory-mapped."""
        tables = []
        for info in infos:
            try:
                path = self.shard_path(name, info, state.version)
                problem = sh.check_shard(path, info, checksum=verify_checksums)
            except CorruptionError as exc:
                problem = str(exc)
            if problem is None:
                try:
                    tables.append(sh.open_table(path))
                    continue
                except (OSError, pa.ArrowException) as exc:
                    problem = f"shard {info.path} is unreadable ({exc})"
            raise CorruptionError(
                f"cannot load version {state.version} of dataset {name!r}: {problem}. "
                f"Run `dyngen verify {name}` to list all damage, then `dyngen restore {name} "
                "<version>` to an earlier version that verifies, and `dyngen gc`."
            )
        return tables

    def contains_prompts(self, name: str, keys: np.ndarray,
                         version: int | None = None) -> np.ndarray:
        """Which prompt keys (see `dyngen.store.keys`) some row of a version already has.

        A version retention expired still answers while its files remain (the grace
        period): a round that loaded it before the vacuum finishes its dedup.
        """
        state = self._loadable_state(name, version, expired_ok=True)
        found = np.zeros(len(keys), dtype=bool)
        if len(keys) == 0:
            return found
        for info in state.shards:
            if info.keys is None:  # a shard of a dataset without a prompt column
                continue
            path = self.shard_path(name, info, state.version, rel=info.keys)
            try:
                found |= pk.contains(path, keys)
            except FileNotFoundError:
                self._loadable_state(name, state.version)  # refuses it if it is expired
                raise CorruptionError(
                    f"prompt keys {info.keys} of version {state.version} of dataset {name!r} "
                    f"are unreadable (the file is missing). Run `dyngen verify {name}`."
                ) from None
            except (OSError, ValueError) as exc:
                raise CorruptionError(
                    f"prompt keys {info.keys} of version {state.version} of dataset {name!r} "
                    f"are unreadable ({exc}). Run `dyngen verify {name}`."
                ) from exc
        return found

    # ---- idempotency -------------------------------------------------------------------
    def find_idempotency_key(self, name: str, key: str) -> VersionRecord | None:
        """The version committed with `key`, if any, in O(1) reads of a fresh Store.

        Each key has a marker naming its version, written before the next version is
        committed; so only the head can lack one, and the head is checked directly. A log
        of format 1 (no markers yet) is searched record by record.
        """
        log = self.log(name)
        # The head first: a key committed below it has its marker by then.
        head = log.head_version()
        if head is None:
            return None
        marked = log.marked_version(key)
        if marked is not None and marked <= head and log.entry(marked).idempotency_key == key:
            return self.record(name, marked)
        found = log.scan_for_key(key, below=head + 1, stop=head)
        if found is None and (marked is not None or log.entry(head).format == 1
                              or log.marker_unusable(key)):
            found = log.scan_for_key(key, below=head)  # no usable marker: read the log
        return None if found is None else self.record(name, found.version)

    # ---- helpers -------------------------------------------------------------------
    def _version(self, name: str, version: int | None) -> int:
        if version is not None:
            return version
        head = self.head_version(name)
        if head is None:
            raise self._not_found(name)
        return head

    def _loadable_state(self, name: str, version: int | None, *,
                        expired_ok: bool = False) -> LogState:
        """A version's state, refusing one that retention expired (unless `expired_ok`)."""
        version = self._version(name, version)
        state = self.state(name, version)
        if expired_ok:
            return state
        try:
            retention = self.state(name).retention
        except CorruptionError:
            retention = None  # a damaged head; a vacuumed shard still reads as missing
        if retention is not None and version < retention.expired_before:
            raise VersionVacuumedError(
                f"version {version} of dataset {name!r} was removed by retention: "
                f"`{retention.describe()}` committed as version {retention.version} at "
                f"{retention.created_at[:19].replace('T', ' ')} UTC removed the data of "
                f"versions 0..{retention.expired_before - 1}. Its record and lineage remain "
                f"(`dyngen log {name}`); the oldest version that loads is "
                f"{retention.expired_before}."
            )
        return state

    def _remember(self, rec: VersionRecord) -> None:
        self._records[(rec.dataset, rec.version)] = rec
        if len(self._records) > _RECORD_CACHE:
            self._records.popitem(last=False)

    @staticmethod
    def _not_found(name: str) -> DatasetNotFoundError:
        error = DatasetNotFoundError(
            f"dataset {name!r} has no committed version. Create it with "
            f"`dyngen import {name} <files>`, or check the store root."
        )
        error.dataset = name
        return error
