"""Version records: the immutable values a commit writes, one JSON file per version.

A record (format 2) holds only its version's change: the shards it adds, the shard
paths it removes (compaction, restore), the quarantine shards of its round, its parent,
operation, row count, schema, lineage and the inbox's batch ends it covers (`covers`,
absent when none: older records read as covering nothing). A restore's record also
carries the whole shard lists it sets (and the covered set), so it reads even over a
damaged parent; its retention and generator state carry on from its parent like any
record's. Records of format 1 (dyngen before the linear log) list every shard of their
version and are read as that state.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from dyngen.errors import CorruptionError
from dyngen.store.covered import Covered, Key, parse_covers

FORMAT_VERSION = 2
READABLE_FORMATS = (1, 2)
Operation = Literal["create", "append", "restore", "compact", "vacuum"]
OPERATIONS: tuple[str, ...] = ("create", "append", "restore", "compact", "vacuum")


@dataclass(frozen=True)
class ShardInfo:
    """One immutable Arrow IPC file, named relative to the dataset folder."""

    path: str
    rows: int
    bytes: int
    sha256: str
    keys: str | None = None  # sorted prompt keys beside a data shard (see store/keys.py)
    lsh: str | None = None  # near-duplicate band keys beside a data shard (see store/lsh.py)
    vec: str | None = None  # semantic vectors beside a data shard (see store/vectors.py)

    @classmethod
    def from_dict(cls, data: Any) -> ShardInfo:
        """Build from a record's JSON, checking every field's type."""
        if not isinstance(data, dict):
            raise TypeError(f"a shard must be an object, found {type(data).__name__}")
        # Checkpoints hold dozens of shards and are read by every fresh Store: check the
        # common case at once, and name the faulty field only when something is off.
        path, rows, size, sha, keys = (data.get("path"), data.get("rows"), data.get("bytes"),
                                       data.get("sha256"), data.get("keys"))
        lsh, vec = data.get("lsh"), data.get("vec")
        if (type(path) is str and type(rows) is int and type(size) is int
                and type(sha) is str and (keys is None or type(keys) is str)
                and (lsh is None or type(lsh) is str) and (vec is None or type(vec) is str)):
            return cls(path, rows, size, sha, keys, lsh, vec)
        return cls(
            path=typed_field(data, "path", str),
            rows=typed_field(data, "rows", int),
            bytes=typed_field(data, "bytes", int),
            sha256=typed_field(data, "sha256", str),
            keys=typed_field(data, "keys", str) if keys is not None else None,
            lsh=typed_field(data, "lsh", str) if lsh is not None else None,
            vec=typed_field(data, "vec", str) if vec is not None else None,
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (no `keys`, `lsh` or `vec` entry for a shard without them)."""
        out: dict[str, Any] = {"path": self.path, "rows": self.rows, "bytes": self.bytes,
                               "sha256": self.sha256}
        if self.keys is not None:
            out["keys"] = self.keys
        if self.lsh is not None:
            out["lsh"] = self.lsh
        if self.vec is not None:
            out["vec"] = self.vec
        return out

    @property
    def files(self) -> tuple[str, ...]:
        """Every file this shard consists of, relative to the dataset folder."""
        return tuple(f for f in (self.path, self.keys, self.lsh, self.vec) if f is not None)


@dataclass(frozen=True)
class Snapshot:
    """A whole state, as a restore record (or a format-1 record) states it."""

    shards: tuple[ShardInfo, ...]
    quarantine: tuple[ShardInfo, ...] | None  # None: format 1, quarantine accumulates
    covered: Covered | None = None  # a restore: the batch ends covered, read over damage


@dataclass(frozen=True)
class Run:
    """Adjacent shards a compaction replaced, and the shards that took their place."""

    removed: tuple[str, ...]
    added: tuple[ShardInfo, ...]


@dataclass(frozen=True)
class LogEntry:
    """One version record exactly as stored: the version's change, not its whole state."""

    dataset: str
    version: int
    parent: int | None
    operation: str
    rows: int
    schema: dict[str, Any]
    created_at: str
    idempotency_key: str | None = None
    rejected: tuple[ShardInfo, ...] = ()  # quarantine shards this version adds
    lineage: dict[str, Any] = field(default_factory=dict)
    format: int = FORMAT_VERSION
    prompt_key: str = "prompt"  # the column whose normalised text dedup keys (set at create)
    added: tuple[ShardInfo, ...] = ()  # data shards this version adds
    removed: tuple[str, ...] = ()  # shard paths (data or quarantine) this version drops
    snapshot: Snapshot | None = None  # the whole state, when the record sets it
    runs: tuple[Run, ...] = ()  # a compaction: where each of its new shards goes
    covers: tuple[Key, ...] = ()  # the inbox's batch ends this version covers (run, step)

    def to_dict(self) -> dict[str, Any]:
        """The record as written: format 2, the change only."""
        out: dict[str, Any] = {
            "format": FORMAT_VERSION, "dataset": self.dataset, "version": self.version,
            "parent": self.parent, "operation": self.operation, "rows": self.rows,
            "created_at": self.created_at, "idempotency_key": self.idempotency_key,
            "prompt_key": self.prompt_key, "added": [s.to_dict() for s in self.added],
            "removed": list(self.removed), "rejected": [s.to_dict() for s in self.rejected],
        }
        if self.snapshot is not None:
            out["snapshot"] = {"shards": [s.to_dict() for s in self.snapshot.shards],
                               "quarantine": [s.to_dict() for s in self.snapshot.quarantine or ()]}
            if self.snapshot.covered:
                out["snapshot"]["covered"] = self.snapshot.covered.to_json()
        if self.runs:
            out["runs"] = [{"removed": list(r.removed), "added": [s.to_dict() for s in r.added]}
                           for r in self.runs]
        if self.covers:  # absent from records that cover nothing, as from older ones
            out["covers"] = [[run, step] for run, step in self.covers]
        out["schema"] = self.schema
        out["lineage"] = self.lineage
        return out

    def to_json(self) -> str:
        """Serialise to the exact bytes written on disk (compact: the log is read often)."""
        # Key order is kept: the schema lists struct fields in their column order.
        return json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=False) + "\n"

    @classmethod
    def from_json(cls, text: str, origin: str) -> LogEntry:
        """Parse a record of format 1 or 2, raising CorruptionError naming `origin`."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CorruptionError(
                f"version record {origin} is not valid JSON ({exc.msg} at line {exc.lineno}); "
                "it was truncated or overwritten. Run `dyngen verify` to list damage, and "
                "`dyngen restore <dataset> <version>` to commit a good earlier version on top."
            ) from exc
        if not isinstance(data, dict):
            raise CorruptionError(f"version record {origin}: expected a JSON object, found "
                                  f"{type(data).__name__}.")
        try:
            return cls._from_dict(data)
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptionError(f"version record {origin} is malformed: {exc}") from exc

    @classmethod
    def _from_dict(cls, data: dict[str, Any]) -> LogEntry:
        fmt = typed_field(data, "format", int)
        if fmt not in READABLE_FORMATS:
            raise ValueError(f"format {fmt} is newer than this dyngen reads "
                             f"({READABLE_FORMATS[-1]}); upgrade dyngen")
        operation = typed_field(data, "operation", str)
        if operation not in OPERATIONS:
            raise ValueError(f"field 'operation' must be one of {OPERATIONS}, found another string")
        parent = data.get("parent")
        if parent is not None and (not isinstance(parent, int) or isinstance(parent, bool)):
            raise ValueError("field 'parent' must be an integer or null, found "
                             f"{type(parent).__name__}")
        key = data.get("idempotency_key")
        if key is not None and not isinstance(key, str):
            raise ValueError("field 'idempotency_key' must be a string or null, found "
                             f"{type(key).__name__}")
        if fmt == 1:
            snapshot: Snapshot | None = Snapshot(shard_list(data, "shards"), None)
            added: tuple[ShardInfo, ...] = ()
            removed: tuple[str, ...] = ()
            runs: tuple[Run, ...] = ()
        else:
            snapshot = None
            if data.get("snapshot") is not None:
                snap = typed_field(data, "snapshot", dict)
                covered = snap.get("covered")
                snapshot = Snapshot(shard_list(snap, "shards"), shard_list(snap, "quarantine"),
                                    None if covered is None else Covered.from_json(covered))
            added = shard_list(data, "added")
            removed = _paths(typed_field(data, "removed", list))
            runs = tuple(Run(_paths(typed_field(r, "removed", list)), shard_list(r, "added"))
                         for r in data.get("runs") or ())
        return cls(
            dataset=typed_field(data, "dataset", str),
            version=typed_field(data, "version", int),
            parent=parent,
            operation=operation,
            rows=typed_field(data, "rows", int),
            schema=typed_field(data, "schema", dict),
            created_at=typed_field(data, "created_at", str),
            idempotency_key=key,
            rejected=shard_list(data, "rejected") if "rejected" in data else (),
            lineage=typed_field(data, "lineage", dict) if "lineage" in data else {},
            format=fmt,
            prompt_key=typed_field(data, "prompt_key", str) if "prompt_key" in data else "prompt",
            added=added,
            removed=removed,
            snapshot=snapshot,
            runs=runs,
            covers=parse_covers(data["covers"]) if "covers" in data else (),
        )


@dataclass(frozen=True)
class VersionRecord(LogEntry):
    """A committed dataset version: its record, plus the full list of its data shards."""

    shards: tuple[ShardInfo, ...] = ()
    # Set by `Store.append` only: the `compact` versions its automatic compaction committed
    # right after this one (not part of the record on disk, nor of equality).
    compactions: tuple[int, ...] = field(default=(), compare=False)

    @classmethod
    def of(cls, entry: LogEntry, shards: tuple[ShardInfo, ...]) -> VersionRecord:
        """The record of `entry` with the data shards of its version's state."""
        fields = {name: getattr(entry, name) for name in LogEntry.__dataclass_fields__}
        return cls(**fields, shards=shards)


def _paths(items: list[Any]) -> tuple[str, ...]:
    if not all(isinstance(p, str) for p in items):
        raise TypeError("shard paths must be strings, found another type")
    return tuple(items)


def shard_list(data: dict[str, Any], key: str) -> tuple[ShardInfo, ...]:
    """The shards listed under `key`, each checked."""
    return tuple(ShardInfo.from_dict(s) for s in typed_field(data, key, list))


def typed_field(data: dict[str, Any], key: str, kind: type) -> Any:
    """Return data[key], raising a precise error if it is absent or of the wrong type."""
    if key not in data:
        raise KeyError(f"missing field {key!r}")
    value = data[key]
    # bool is an int subclass; a record with rows=true is damaged, not valid.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        # The type, not the value: a damaged record may hold anything, of any size.
        raise TypeError(f"field {key!r} must be {kind.__name__}, found {type(value).__name__}")
    return value


@dataclass(frozen=True)
class PendingCommit:
    """A version's change, written but not yet committed, and the parent it expects."""

    dataset: str
    parent: int | None
    operation: str
    new_shards: tuple[ShardInfo, ...] = ()  # data shards this commit wrote
    rejected: tuple[ShardInfo, ...] = ()  # quarantine shards this commit wrote
    removed: tuple[str, ...] = ()  # shard paths it drops (a compaction's inputs)
    runs: tuple[Run, ...] = ()  # a compaction: which new shard replaces which inputs
    restore_of: int | None = None  # a restore: the version whose rows it sets
    schema: dict[str, Any] = field(default_factory=dict)
    idempotency_key: str | None = None
    lineage: dict[str, Any] = field(default_factory=dict)
    round_id: str | None = None
    generator: str | None = None
    prompt_key: str = "prompt"
    covers: tuple[Key, ...] = ()  # an append: the batch ends it covers (checked at commit)

    @property
    def version(self) -> int:
        """The version number this commit will create if it wins."""
        return 0 if self.parent is None else self.parent + 1
