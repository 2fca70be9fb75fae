"""A Delta Lake mirror of a dataset: one Delta commit per dyngen version, in order.

Delta version k is dyngen version k. A commit holds the difference between the two
versions' shards: an append adds the new shard's file, a compaction removes the files of
the shards it merged and adds the merged one (`dataChange: false`: the same rows), a
restore removes what the restored version lacks and adds fresh files for the shards it
brings back, a vacuum changes no file. A version whose schema differs from the mirror's
(a round added fields inside extra_info, or a restore went back before one did) replaces
every file with one in the new schema, since delta-rs writes a new schema only with an
overwrite. Each commit's custom metadata names the dyngen version, operation, round,
trigger step and event id; the last commit's is how a later run knows where to go on.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from dyngen.errors import CorruptionError, MirrorError, VersionNotFoundError
from dyngen.mirror import files as mf
from dyngen.progress import QUIET, Bar
from dyngen.store import shards as sh
from dyngen.store.location import local_path, open_backend, split_url
from dyngen.store.reader import DATA_DIR, StoreReader
from dyngen.store.records import LogEntry, ShardInfo
from dyngen.store.room import no_room_cause
from dyngen.store.state import LogState, Retention

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from deltalake.transaction import AddAction

KEY = "dyngen."  # prefix of the commit metadata dyngen writes
# dyngen keeps every version's record; the mirror keeps every Delta version likewise.
TABLE_CONFIGURATION = {"delta.enableExpiredLogCleanup": "false"}
_ATTEMPTS = 5  # another process mirroring the same versions: start over this often


@dataclass(frozen=True)
class MirrorResult:
    """What one call did: the versions it committed and where the mirror is now."""

    dataset: str
    dest: str
    committed: tuple[int, ...]
    version: int  # the dyngen (and Delta) version the mirror holds now
    deleted_files: int = 0  # data files removed because retention removed their shards


def mirror_delta(store: StoreReader, name: str, dest: str | os.PathLike[str], *,
                 storage_options: Mapping[str, Any] | None = None,
                 delta_options: Mapping[str, Any] | None = None, up_to: int | None = None,
                 progress: Bar = QUIET) -> MirrorResult:
    """Bring the Delta table at `dest` up to version `up_to` (the head) of dataset `name`.

    Incremental: versions already mirrored are checked, not written again; a current
    mirror gets no commit. `storage_options` reach `dest` as fsspec takes them (the
    store's own options when `dest` is on the store's scheme); `delta_options` go to
    delta-rs as they are. Refuses a `dest` that is not empty and not this dataset's mirror.
    """
    _deltalake()
    head = store.head(name).version
    target = head if up_to is None else up_to
    if not 0 <= target <= head:
        raise MirrorError(f"cannot mirror {name!r} up to version {target}: expected a version "
                          f"in 0..{head} (the head).")
    mirror = _Mirror(store, name, dest, storage_options, delta_options)
    committed: list[int] = []
    for attempt in range(_ATTEMPTS):
        start = mirror.open()
        if start > target:
            break
        progress.stage(f"mirroring {name} v{start}..v{target} to {mirror.uri}",
                       target - start + 1, "versions")
        try:
            for entry, state in store.log(name).replay(start, target):
                mirror.commit(entry, state)
                committed.append(entry.version)
                progress.advance()
            break
        except OSError as exc:
            cause = no_room_cause(exc, f"mirror {mirror.uri}")
            if cause is None:
                raise
            at = (f"holds version {mirror.version} of {name!r}" if mirror.version >= 0
                  else "was not created")
            raise MirrorError(
                f"{cause}. The mirror {at}: version {mirror.version + 1} was not committed "
                f"(its files are written again on the next run). Free space on that disk, "
                f"then run `dyngen export {name}` again: it goes on from version "
                f"{mirror.version + 1}.") from exc
        except _Raced:
            if attempt == _ATTEMPTS - 1:
                raise MirrorError(
                    f"another process kept committing to the mirror {mirror.uri} of {name!r} "
                    f"while this one did (tried {_ATTEMPTS} times); run one mirror at a time."
                ) from None
    return MirrorResult(name, mirror.uri, tuple(committed), mirror.version, mirror.deleted)


class _Raced(Exception):
    """Another writer committed the Delta version this one was about to."""


class _Mirror:
    """One Delta table mirroring one dataset, as far as it has got."""

    def __init__(self, store: StoreReader, name: str, dest: str | os.PathLike[str],
                 storage_options: Mapping[str, Any] | None,
                 delta_options: Mapping[str, Any] | None) -> None:
        self.store, self.name = store, name
        self.uri = _table_uri(dest)
        self.backend = open_backend(self.uri, storage_options=storage_options,
                                    single_writer=True)  # delta-rs arbitrates commits
        self.options = mf.delta_options(self.uri, storage_options, delta_options) or None
        self.table: DeltaTable | None = None
        self.files: dict[str, tuple[str, int]] = {}  # shard stem -> (mirror file, bytes)
        self.schema: str | None = None  # the mirror's Delta schema, as JSON
        self.digest: str | None = None  # the schema_digest of the dyngen version it holds
        self.version = -1
        self.deleted = 0
        self.retention: Retention | None | bool = False  # the store's, read when first needed

    # ---- where the mirror is ----------------------------------------------------------
    def open(self) -> int:
        """The next version to mirror, after checking `dest` is this dataset's mirror."""
        from deltalake import DeltaTable

        # Looked up through fsspec: delta-rs's own check (is_deltatable) lists the log,
        # which hangs on moto's S3; a table has its first commit or a checkpoint.
        if not (self.backend.exists(f"_delta_log/{0:020d}.json")
                or self.backend.exists("_delta_log/_last_checkpoint")):
            self._check_unused()
            self.table, self.files, self.schema, self.version = None, {}, None, -1
            self.digest = None
            return 0
        table = DeltaTable(self.uri, storage_options=self.options)
        version = table.version()
        last = self._commit_info(version)
        if last.get(f"{KEY}dataset") != self.name or last.get(f"{KEY}version") != version:
            raise MirrorError(
                f"{self.uri} is a Delta table that is not a dyngen mirror of {self.name!r}: "
                f"expected its last commit (Delta version {version}) to carry "
                f"{KEY}dataset={self.name!r} and {KEY}version={version}, found "
                f"{_found(last)}. Something else wrote to it; mirror to another DEST, or "
                "delete this one to mirror afresh."
            )
        self._check_same_version(version, last)
        self.table, self.version = table, version
        self.schema = table.schema().to_json()
        self.digest = last.get(f"{KEY}schema")
        # Through the Arrow C stream: pa.table() would first import pandas to check for it.
        actions = pa.RecordBatchReader.from_stream(table.get_add_actions(flatten=True)).read_all()
        self.files = {}
        for path, size in zip(actions.column("path").to_pylist(),
                              actions.column("size_bytes").to_pylist(), strict=True):
            found = mf.FILE_NAME.fullmatch(path)
            if found is None:
                raise MirrorError(f"{self.uri} holds {path}, which dyngen did not write; "
                                  "mirror to another DEST, or delete this one.")
            self.files[found["stem"]] = (path, int(size))
        return version + 1

    def _commit_info(self, version: int) -> dict[str, Any]:
        """The commitInfo action of Delta version `version`, read from the log as the Delta
        protocol lays it out (delta-rs's history() lists the log, which hangs on moto)."""
        text = self.backend.read_bytes(f"_delta_log/{version:020d}.json").decode("utf-8")
        for line in text.splitlines():
            action = json.loads(line) if line.strip() else {}
            if "commitInfo" in action:
                return dict(action["commitInfo"])
        return {}

    def _check_same_version(self, version: int, last: Mapping[str, Any]) -> None:
        """The version the mirror ends with must be the store's version of that number."""
        try:
            record = self.store.record(self.name, version)
        except VersionNotFoundError:
            record = None
        if record is None or record.created_at != last.get(f"{KEY}created_at"):
            found = ("no such version" if record is None
                     else f"a version committed at {record.created_at}")
            raise MirrorError(
                f"the mirror {self.uri} ends with version {version} of {self.name!r}, "
                f"committed at {last.get(f'{KEY}created_at')}, but the store has {found} "
                f"(head {self.store.head_version(self.name)}): it mirrors another history "
                "(the dataset was made again, or this is another store's mirror). Delete "
                "the mirror to mirror afresh, or mirror to another DEST."
            )

    def _check_unused(self) -> None:
        foreign = [f for f in self.backend.list("")
                   if not (mf.FILE_NAME.fullmatch(f) or f.startswith(".tmp-"))]
        foreign += [f"{d}/" for d in self.backend.list_dirs("")]
        if foreign:
            raise MirrorError(
                f"{self.uri} is not empty ({', '.join(sorted(foreign)[:3])}"
                f"{', …' if len(foreign) > 3 else ''}) and is not a Delta table: expected an "
                f"empty folder or a dyngen mirror of {self.name!r}. Choose another DEST."
            )

    # ---- one version --------------------------------------------------------------------
    def commit(self, entry: LogEntry, state: LogState) -> None:
        """Commit Delta version `entry.version`: the change from the mirror's files to
        `state`'s shards."""
        from deltalake import CommitProperties
        from deltalake.exceptions import CommitFailedError, DeltaError
        from deltalake.transaction import RemoveAction, create_table_with_add_actions

        digest = schema_digest(state.schema)
        same = self.table is not None and digest == self.digest
        # The version's schema is read (with `datasets`) only when it may have changed, or
        # when a shard to write is not in the mirror's schema already.
        target = _VersionSchema(self.name, entry.version, state.schema)
        delta = self.table.schema() if same and self.table is not None else target.delta()
        rewrite = self.table is not None and not same and delta.to_json() != self.schema
        props = CommitProperties(custom_metadata=commit_metadata(entry), max_commit_retries=0)
        shards = {mf.shard_stem(s): s for s in state.shards}
        try:
            if self.table is None:
                adds = [self._write(s, entry.version, target, True) for s in shards.values()]
                create_table_with_add_actions(
                    self.uri, delta, adds, mode="error", name=self.name,
                    description=f"dyngen mirror of dataset {self.name!r}",
                    configuration=TABLE_CONFIGURATION, storage_options=self.options,
                    commit_properties=props)
            elif rewrite:  # every file again, in the new schema (overwrite removes the old)
                adds = [self._write(s, entry.version, target, True, fit=False)
                        for s in shards.values()]
                self.table.create_write_transaction(adds, "overwrite", delta,
                                                    commit_properties=props)
            else:
                change = entry.operation != "compact"  # a compaction keeps the same rows
                removes = [RemoveAction(path, change, mf.now_ms(), size, {})
                           for stem, (path, size) in self.files.items() if stem not in shards]
                adds = [self._write(s, entry.version, target, change)
                        for stem, s in shards.items() if stem not in self.files]
                self.table.create_write_transaction([*removes, *adds], "append", delta,
                                                    commit_properties=props)
        except CommitFailedError:
            raise _Raced() from None
        except DeltaError as exc:
            if self.table is None and "exist" in str(exc).lower():
                raise _Raced() from None  # another process created the table first
            raise MirrorError(f"delta-rs could not commit version {entry.version} of "
                              f"{self.name!r} to {self.uri}: {exc}") from exc
        self._committed(entry, shards, adds, delta.to_json(), keep=not rewrite)
        self.digest = digest

    def _committed(self, entry: LogEntry, shards: Mapping[str, ShardInfo],
                   adds: list[AddAction], schema: str, *, keep: bool) -> None:
        from deltalake import DeltaTable

        if self.table is None:
            self.table = DeltaTable(self.uri, storage_options=self.options)
        else:
            self.table.update_incremental()
        if self.table.version() != entry.version:
            raise MirrorError(f"the mirror {self.uri} is at Delta version "
                              f"{self.table.version()} after committing dyngen version "
                              f"{entry.version}; it must be the same number. Was another "
                              "writer at work? Delete the mirror to mirror afresh.")
        kept = {k: v for k, v in self.files.items() if k in shards} if keep else {}
        kept.update({mf.FILE_NAME.fullmatch(a.path)["stem"]: (a.path, a.size)  # type: ignore[index]
                     for a in adds})
        self.files, self.schema, self.version = kept, schema, entry.version
        if entry.operation == "vacuum":
            self.deleted += self._sweep()

    def _write(self, info: ShardInfo, version: int, target: _VersionSchema,
               data_change: bool, *, fit: bool = True) -> AddAction:
        """Write the mirror file of one shard, its rows in the version's schema (`fit`: a
        shard already in the mirror's schema is written as it is), and say how to add it."""
        from deltalake import Schema
        from deltalake.transaction import AddAction

        name = mf.file_name(info, version)
        if not self._readable(info, version):
            # Retention removed the shard before the mirror got here: the Delta version
            # names the file it would have, and reading it fails as `store.load` does.
            return AddAction(name, info.bytes, {}, mf.now_ms(), data_change,
                             f'{{"numRecords":{info.rows}}}')
        path = self.store.shard_path(self.name, info, version)
        problem = sh.check_shard(path, info)
        if problem is not None:
            raise CorruptionError(f"cannot mirror version {version} of {self.name!r}: "
                                  f"{problem}. Run `dyngen verify {self.name}`.")
        with pa.memory_map(str(path)) as source:
            table = pa.ipc.open_stream(source).read_all()  # mapped: no row is read yet
        own = mf.delta_schema(table.schema)
        if fit and self.schema is not None and Schema.from_arrow(own).to_json() == self.schema:
            table = table.cast(own)  # written in this schema: only Delta's types to apply
        else:
            table = table.cast(target.arrow())  # older fields widened (extra_info's nulls)
        data = mf.parquet_bytes(table)
        self.backend.replace(name, data)  # same name, same rows: a rerun may rewrite it
        return AddAction(name, len(data), {}, mf.now_ms(), data_change, mf.file_stats(table))

    def _readable(self, info: ShardInfo, version: int) -> bool:
        """False only for a shard retention deleted (its version expired); damage raises."""
        if self.retention is False:
            self.retention = self.store.state(self.name).retention
        retention = self.retention
        if retention is None or version >= retention.expired_before:
            return True
        return self.store.backend.exists(self.store.shard_rel(self.name, info, version))

    def _sweep(self) -> int:
        """Delete the mirror files whose shards retention deleted from the store."""
        live = {path for path, _ in self.files.values()}
        deleted = 0
        for file in self.backend.list(""):
            found = mf.FILE_NAME.fullmatch(file)
            if found is None or file in live:
                continue
            shard = f"{self.name}/{DATA_DIR}/{found['stem']}.arrow"
            if not self.store.backend.exists(shard) and self.backend.delete(file):
                deleted += 1
        return deleted


class _VersionSchema:
    """A version's schema in Delta's types, read from its record when first needed."""

    def __init__(self, name: str, version: int, schema: dict[str, Any]) -> None:
        self.name, self.version, self.schema = name, version, schema
        self._arrow: pa.Schema | None = None

    def arrow(self) -> pa.Schema:
        """The Arrow schema the mirror's files of this version have."""
        if self._arrow is None:
            self._arrow = mf.delta_schema(sh.schema_from_json(self.schema))
        return self._arrow

    def delta(self) -> Any:
        """The same as a deltalake Schema, or MirrorError naming a type Delta lacks."""
        from deltalake import Schema

        try:
            return Schema.from_arrow(self.arrow())
        except Exception as exc:  # delta-rs names the type it has no Delta form for
            raise MirrorError(f"version {self.version} of {self.name!r} has a column Delta "
                              f"cannot hold ({exc}); its schema: {self.arrow()}.") from exc


def schema_digest(schema: dict[str, Any]) -> str:
    """A short fingerprint of a version's schema (its record's JSON form)."""
    text = json.dumps(schema, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def commit_metadata(entry: LogEntry) -> dict[str, Any]:
    """What a mirror commit says of its dyngen version (None where the version has none)."""
    lineage = entry.lineage if isinstance(entry.lineage, dict) else {}
    trigger = lineage.get("trigger") if isinstance(lineage.get("trigger"), dict) else {}
    return {f"{KEY}dataset": entry.dataset, f"{KEY}version": entry.version,
            f"{KEY}operation": entry.operation, f"{KEY}created_at": entry.created_at,
            f"{KEY}rows": entry.rows, f"{KEY}round": lineage.get("round"),
            f"{KEY}step": trigger.get("step"), f"{KEY}event_id": trigger.get("event_id"),
            f"{KEY}schema": schema_digest(entry.schema)}


def _table_uri(dest: str | os.PathLike[str]) -> str:
    """`dest` as delta-rs takes it: an absolute local path, or the URL."""
    parts = split_url(os.fspath(dest))
    if parts is not None and parts[0] == "memory":
        raise MirrorError(f"cannot mirror to {dest}: delta-rs has no memory:// filesystem. "
                          "Expected a local folder or an s3://, gs:// or az:// URL.")
    local = local_path(os.fspath(dest))
    return str(local.resolve()) if local is not None else os.fspath(dest).rstrip("/")


def _found(commit: Mapping[str, Any]) -> str:
    ours = {k: v for k, v in commit.items() if k.startswith(KEY)}
    return str(ours) if ours else f"a commit of {commit.get('operation', 'another writer')} " \
        f"by {commit.get('engineInfo') or commit.get('clientVersion') or 'an unknown engine'}"


def _deltalake() -> None:
    try:
        import deltalake  # noqa: F401
    except ImportError:
        raise MirrorError("a Delta mirror needs the deltalake package: "
                          "pip install 'dyngen[delta]'.") from None
