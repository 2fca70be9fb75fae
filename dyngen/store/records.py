"""Version records: the immutable values a commit writes, one JSON file per version."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from dyngen.errors import CorruptionError

FORMAT_VERSION = 1
Operation = Literal["create", "append", "restore"]
OPERATIONS: tuple[str, ...] = ("create", "append", "restore")


@dataclass(frozen=True)
class ShardInfo:
    """One immutable Arrow IPC file, named relative to the dataset folder."""

    path: str
    rows: int
    bytes: int
    sha256: str
    keys: str | None = None  # sorted prompt keys beside a data shard (see store/keys.py)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ShardInfo:
        """Build from a record's JSON, checking every field's type."""
        return cls(
            path=_typed(data, "path", str),
            rows=_typed(data, "rows", int),
            bytes=_typed(data, "bytes", int),
            sha256=_typed(data, "sha256", str),
            keys=_typed(data, "keys", str) if data.get("keys") is not None else None,
        )

    @property
    def files(self) -> tuple[str, ...]:
        """Every file this shard consists of, relative to the dataset folder."""
        return (self.path,) if self.keys is None else (self.path, self.keys)


@dataclass(frozen=True)
class VersionRecord:
    """A committed dataset version: what it contains and how it came to be."""

    dataset: str
    version: int
    parent: int | None
    operation: str
    shards: tuple[ShardInfo, ...]
    rows: int
    schema: dict[str, Any]
    created_at: str
    idempotency_key: str | None = None
    rejected: tuple[ShardInfo, ...] = ()
    lineage: dict[str, Any] = field(default_factory=dict)
    format: int = FORMAT_VERSION
    prompt_key: str = "prompt"  # the column whose normalised text dedup keys (set at create)

    def to_json(self) -> str:
        """Serialise to the exact bytes written on disk."""
        # Key order is kept: the schema lists struct fields in their column order.
        return json.dumps(asdict(self), indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str, origin: str) -> VersionRecord:
        """Parse a record, raising CorruptionError that names `origin` on any defect."""
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
            operation = _typed(data, "operation", str)
            if operation not in OPERATIONS:
                raise ValueError(f"field 'operation' must be one of {OPERATIONS}, found "
                                 "another string")
            parent = data.get("parent")
            if parent is not None and not isinstance(parent, int):
                raise ValueError("field 'parent' must be an integer or null, found "
                                 f"{type(parent).__name__}")
            key = data.get("idempotency_key")
            if key is not None and not isinstance(key, str):
                raise ValueError("field 'idempotency_key' must be a string or null, found "
                                 f"{type(key).__name__}")
            return cls(
                dataset=_typed(data, "dataset", str),
                version=_typed(data, "version", int),
                parent=parent,
                operation=operation,
                shards=tuple(ShardInfo.from_dict(s) for s in _typed(data, "shards", list)),
                rows=_typed(data, "rows", int),
                schema=_typed(data, "schema", dict),
                created_at=_typed(data, "created_at", str),
                idempotency_key=key,
                rejected=tuple(ShardInfo.from_dict(s) for s in data.get("rejected", [])),
                lineage=_typed(data, "lineage", dict) if "lineage" in data else {},
                format=_typed(data, "format", int),
                prompt_key=_typed(data, "prompt_key", str) if "prompt_key" in data else "prompt",
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptionError(f"version record {origin} is malformed: {exc}") from exc


def _typed(data: dict[str, Any], key: str, kind: type) -> Any:
    """Return data[key], raising a precise error if it is absent or of the wrong type."""
    if key not in data:
        raise KeyError(f"missing field {key!r}")
    value = data[key]
    # bool is an int subclass; a record with rows=true is damaged, not valid.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        # The type, not the value: a damaged record may hold anything, of any size.
        raise TypeError(f"field {key!r} must be {kind.__name__}, found {type(value).__name__}")
    return value
