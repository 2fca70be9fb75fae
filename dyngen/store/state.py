"""The full state of a version, computed by replaying records, and its checkpoint form.

Replay is Delta Lake's rule, simplified: a record's added shards take the place of the
first shard it removes (a compaction keeps the rows in order), or go at the end (an
append); a record with a snapshot (a restore) sets the whole state.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dyngen.errors import CorruptionError
from dyngen.store.covered import EMPTY, Covered
from dyngen.store.records import FORMAT_VERSION, LogEntry, ShardInfo, shard_list, typed_field


@dataclass(frozen=True)
class Retention:
    """What the newest `vacuum` decided: versions below `expired_before` are gone."""

    version: int  # the vacuum's own version
    created_at: str
    expired_before: int
    keep_versions: int | None = None
    keep_days: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form, as in a vacuum record's lineage and in checkpoints."""
        return {"version": self.version, "created_at": self.created_at,
                "expired_before": self.expired_before, "keep_versions": self.keep_versions,
                "keep_days": self.keep_days}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Retention:
        """Parse the JSON form, checking types."""
        data = dict(data)
        kv, kd = data.get("keep_versions"), data.get("keep_days")
        if kv is not None and not isinstance(kv, int):
            raise TypeError(f"keep_versions must be an integer or null, found {type(kv).__name__}")
        if kd is not None and not isinstance(kd, (int, float)):
            raise TypeError(f"keep_days must be a number or null, found {type(kd).__name__}")
        return cls(typed_field(data, "version", int), typed_field(data, "created_at", str),
                   typed_field(data, "expired_before", int), kv, kd)

    def describe(self) -> str:
        """How a user asked for it, e.g. `dyngen vacuum --keep-versions 100`."""
        flags = []
        if self.keep_versions is not None:
            flags.append(f"--keep-versions {self.keep_versions}")
        if self.keep_days is not None:
            flags.append(f"--keep-days {self.keep_days:g}")
        return " ".join(["dyngen vacuum", *flags])


@dataclass(frozen=True)
class LogState:
    """Everything version `version` is: its shards, quarantine, schema and retention."""

    dataset: str
    version: int
    shards: tuple[ShardInfo, ...]
    quarantine: tuple[ShardInfo, ...]
    rows: int
    schema: dict[str, Any]
    prompt_key: str
    retention: Retention | None = None
    # The newest version each generator class made (up to this one): a round finds the
    # state its generator left without walking back through the log.
    generators: Mapping[str, int] = field(default_factory=dict)
    # The inbox's batch ends covered by this version or an older one (see store/covered.py).
    covered: Covered = EMPTY

    @property
    def expired_before(self) -> int:
        """Versions below this were expired by retention (0: none)."""
        return self.retention.expired_before if self.retention is not None else 0

    @property
    def files(self) -> set[str]:
        """Every file (shards, prompt keys, quarantine) this version needs."""
        return {f for s in self.shards + self.quarantine for f in s.files}

    def to_json(self) -> str:
        """The checkpoint's text: a checksum line, then the state as one line of JSON."""
        body = json.dumps(self._body(), separators=(",", ":"), ensure_ascii=False)
        return f"{hashlib.sha256(body.encode()).hexdigest()}\n{body}\n"

    def _body(self) -> dict[str, Any]:
        body = {
            "format": FORMAT_VERSION, "dataset": self.dataset, "version": self.version,
            "rows": self.rows, "prompt_key": self.prompt_key,
            "shards": [s.to_dict() for s in self.shards],
            "quarantine": [s.to_dict() for s in self.quarantine],
            "retention": self.retention.to_dict() if self.retention else None,
            "generators": dict(self.generators), "schema": self.schema,
        }
        if self.covered:  # absent when nothing is covered, as in older checkpoints
            body["covered"] = self.covered.to_json()
        return body

    @classmethod
    def from_json(cls, text: str, origin: str) -> LogState:
        """Parse and check a checkpoint; CorruptionError naming `origin` if it is damaged."""
        try:
            digest, _, body = text.partition("\n")
            body = body.rstrip("\n")
            if digest != hashlib.sha256(body.encode()).hexdigest():
                raise ValueError("its checksum does not match its content")
            data = json.loads(body)
            if not isinstance(data, dict):
                raise TypeError("expected a JSON object")
            retention = data.get("retention")
            generators = typed_field(data, "generators", dict)
            if not all(isinstance(v, int) for v in generators.values()):
                raise TypeError("generators must map class names to versions")
            return cls(
                dataset=typed_field(data, "dataset", str),
                version=typed_field(data, "version", int),
                shards=shard_list(data, "shards"), quarantine=shard_list(data, "quarantine"),
                rows=typed_field(data, "rows", int), schema=typed_field(data, "schema", dict),
                prompt_key=typed_field(data, "prompt_key", str),
                retention=Retention.from_dict(retention) if retention is not None else None,
                generators=generators,
                covered=Covered.from_json(data["covered"]) if "covered" in data else EMPTY,
            )
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise CorruptionError(f"checkpoint {origin} is damaged ({exc}); it is only an "
                                  "optimisation: delete it, reads replay the records") from exc

    def same_as(self, other: LogState) -> bool:
        """Whether two states are equal (a checkpoint against replay)."""
        return self._body() == other._body()


def apply(state: LogState | None, entry: LogEntry) -> LogState:
    """The state after `entry`, from the state of its parent (None before version 0)."""
    snap = entry.snapshot
    self_contained = snap is not None and snap.quarantine is not None
    if state is None and entry.version != 0 and not self_contained:
        raise CorruptionError(f"version {entry.version} of {entry.dataset!r} cannot be read "
                              "without its parent's state")
    prev_shards = state.shards if state is not None else ()
    prev_quarantine = state.quarantine if state is not None else ()
    if snap is not None:
        shards = snap.shards
        quarantine = (snap.quarantine if snap.quarantine is not None
                      else prev_quarantine + entry.rejected)  # format 1 lists only data
    elif entry.runs:
        shards, quarantine = prev_shards, prev_quarantine
        for run in entry.runs:  # each run is in one list: the data or the quarantine
            if run.removed and run.removed[0] in {s.path for s in quarantine}:
                quarantine = splice(quarantine, run.removed, run.added)
            else:
                shards = splice(shards, run.removed, run.added)
    else:
        shards = splice(prev_shards, entry.removed, entry.added)
        quarantine = splice(prev_quarantine, entry.removed, entry.rejected)
    retention = state.retention if state is not None else None
    if entry.operation == "vacuum":
        try:
            retention = Retention.from_dict(entry.lineage.get("retention") or {})
        except (KeyError, TypeError) as exc:
            raise CorruptionError(f"version {entry.version} of {entry.dataset!r} is a vacuum "
                                  f"whose retention is malformed ({exc})") from exc
    generators = state.generators if state is not None else {}
    made_by = (entry.lineage.get("generator") or {}) if isinstance(
        entry.lineage.get("generator"), dict) else {}
    if isinstance(made_by.get("class"), str):
        generators = {**generators, made_by["class"]: entry.version}
    # The covered set only grows; over damage, a restore carries what its parent covered.
    covered = state.covered if state is not None else (
        snap.covered if snap is not None and snap.covered is not None else EMPTY)
    return LogState(entry.dataset, entry.version, shards, quarantine, entry.rows, entry.schema,
                    entry.prompt_key, retention, generators, covered.with_keys(entry.covers))


def splice(items: tuple[ShardInfo, ...], removed: tuple[str, ...],
           added: tuple[ShardInfo, ...]) -> tuple[ShardInfo, ...]:
    """`items` without `removed`; `added` where the first removed one was, else at the end."""
    if not removed:  # an append: nothing to look for
        return items + added
    gone = set(removed)
    if not gone.intersection(s.path for s in items):
        return items + added
    out: list[ShardInfo] = []
    placed = False
    for s in items:
        if s.path not in gone:
            out.append(s)
        elif not placed:
            out.extend(added)
            placed = True
    return tuple(out)


def still_applies(removed: tuple[str, ...], head: LogState) -> bool:
    """Whether every input of a compaction is still in the head, in the same runs."""
    wanted = set(removed)
    found = 0
    for items in (head.shards, head.quarantine):
        at = [i for i, s in enumerate(items) if s.path in wanted]
        order = [items[i].path for i in at]
        if order != [p for p in removed if p in set(order)]:
            return False
        found += len(at)
    return found == len(wanted)
