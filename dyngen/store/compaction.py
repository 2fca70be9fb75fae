"""Compaction: adjacent small shards rewritten into larger ones, as a `compact` version.

The policy is tiered, after Lucene's log merge policy: a shard's tier is the logarithm
of its row count to the base `fan_in` (rows add up exactly; bytes carry a fixed schema
header), and `fan_in` adjacent shards of one tier become one shard of the next. A row is
rewritten about log_fan_in(dataset rows / round rows) times in the dataset's life, never
once per compaction, and shards of `target_bytes` or more are never rewritten. Like
Delta Lake's auto compaction (50 files), nothing happens until the head holds more than
`max_small_shards` small shards. Rows keep their order and their provenance columns; the
prompt keys, near-duplicate and semantic sidecars of the merged shards are merged too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from dyngen.errors import CompactionConflictError, ConfigError, CorruptionError
from dyngen.faults import crash_point
from dyngen.store import shards as sh
from dyngen.store.index import merged_sidecar
from dyngen.store.reader import DATA_DIR, REJECTED_DIR, REJECTED_SCHEMA
from dyngen.store.records import PendingCommit, Run, ShardInfo, VersionRecord
from dyngen.store.semantic import VECTORS
from dyngen.store.state import LogState

if TYPE_CHECKING:
    from dyngen.store.writer import StoreWriter

# Shards within this many tiers of a run's largest belong to its tier (Lucene: 0.75).
_TIER_SPAN = 0.75
_MAX_COMMITS = 32


@dataclass(frozen=True)
class CompactionPolicy:
    """When to compact (more than `max_small_shards` below `target_bytes`) and how."""

    max_small_shards: int = 50
    fan_in: int = 8
    target_bytes: int = 128 << 20

    def __post_init__(self) -> None:
        for name, low in (("max_small_shards", 0), ("fan_in", 2), ("target_bytes", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"compaction {name}: expected an integer >= {low}, found "
                                  f"{value!r}.")

    def wants(self, shards: tuple[ShardInfo, ...]) -> bool:
        """Whether a list of shards holds more small shards than the policy allows."""
        return sum(s.bytes < self.target_bytes for s in shards) > self.max_small_shards

    def runs(self, shards: Sequence[ShardInfo], *, full: bool = False) -> list[tuple[int, int]]:
        """Spans [start, stop) of adjacent shards to merge, each into one new shard.

        Tiers cascade: merging `fan_in` shards may complete a run of the next tier, and
        that run then takes in the shard just made (one span, one output).
        """
        sizes = [(s.rows, s.bytes) for s in shards]
        if full:
            return _small_runs([b for _, b in sizes], self.target_bytes)
        spans = [(i, i + 1) for i in range(len(sizes))]
        while (window := self._window(sizes)) is not None:
            start, stop = window
            part = sizes[start:stop]
            sizes[start:stop] = [(sum(r for r, _ in part), sum(b for _, b in part))]
            spans[start:stop] = [(spans[start][0], spans[stop - 1][1])]
        return [span for span in spans if span[1] - span[0] > 1]

    def _window(self, sizes: list[tuple[int, int]]) -> tuple[int, int] | None:
        """The first `fan_in` adjacent small shards of one tier, or None."""
        tiers = [math.log(max(rows, 1), self.fan_in) for rows, _ in sizes]
        start = 0
        while start < len(sizes):
            if sizes[start][1] >= self.target_bytes:
                start += 1
                continue
            stop = start
            while stop < len(sizes) and sizes[stop][1] < self.target_bytes:
                stop += 1
            top = max(tiers[start:stop]) - _TIER_SPAN
            last = max(i for i in range(start, stop) if tiers[i] >= top)
            if last - start + 1 >= self.fan_in:
                return start, start + self.fan_in
            start = last + 1
        return None


def _small_runs(sizes: list[int], target: int) -> list[tuple[int, int]]:
    """Every maximal run of two or more adjacent shards below `target` (a full compaction)."""
    out, start = [], 0
    while start < len(sizes):
        stop = start
        while stop < len(sizes) and sizes[stop] < target:
            stop += 1
        if stop - start > 1:
            out.append((start, stop))
        start = stop + 1 if stop == start else stop
    return out


def compact(store: StoreWriter, name: str, policy: CompactionPolicy | None = None, *,
            full: bool = False) -> list[VersionRecord]:
    """Commit compactions until the policy is satisfied; the versions made (often none)."""
    policy = policy or CompactionPolicy()
    made: list[VersionRecord] = []
    for _ in range(_MAX_COMMITS):
        pending = prepare_compaction(store, name, policy, full=full)
        if pending is None:
            break
        try:
            made.append(store.commit_with_rebase(pending))
        except CompactionConflictError:
            continue  # another compaction got there first: look at the new head
        except BaseException:
            store.abort(pending)
            raise
        crash_point("compact.after_commit")
        if full:
            break
    return made


def prepare_compaction(store: StoreWriter, name: str, policy: CompactionPolicy, *,
                       full: bool = False) -> PendingCommit | None:
    """Write the merged shards for the head's runs; None if there is nothing to merge."""

    head = store.state(name)
    plans = []
    for items in (head.shards, head.quarantine):
        wanted = full or policy.wants(items)
        spans = policy.runs(items, full=full) if wanted else []
        plans.append([items[a:b] for a, b in spans])
    if not any(plans):
        return None
    runs: list[Run] = []
    try:
        for group in plans[0]:
            runs.append(Run(tuple(s.path for s in group),
                            _merge(store, head, group, DATA_DIR, policy.target_bytes)))
        for group in plans[1]:
            runs.append(Run(tuple(s.path for s in group),
                            _merge(store, head, group, REJECTED_DIR, policy.target_bytes)))
    except BaseException:
        _remove(store, name, [s for run in runs for s in run.added])
        raise
    crash_point("compact.after_shard_write")
    inputs = [s for group in plans[0] + plans[1] for s in group]
    # Merged quarantine shards are in the runs only: a record's `rejected` stays the
    # quarantine of its own round (a compaction is none).
    return PendingCommit(
        dataset=name, parent=head.version, operation="compact",
        new_shards=tuple(s for r in runs[: len(plans[0])] for s in r.added),
        removed=tuple(s.path for s in inputs), runs=tuple(runs), schema=head.schema,
        prompt_key=head.prompt_key,
        lineage={"compaction": {
            "shards_in": len(inputs), "shards_out": sum(len(r.added) for r in runs),
            "rows": sum(s.rows for s in inputs), "bytes_in": sum(s.bytes for s in inputs),
            "full": full, "max_small_shards": policy.max_small_shards,
            "fan_in": policy.fan_in, "target_bytes": policy.target_bytes}},
    )


def _merge(store: StoreWriter, head: LogState, group: tuple[ShardInfo, ...], sub: str,
           target_bytes: int) -> tuple[ShardInfo, ...]:
    """Rewrite adjacent shards as new ones of at most about `target_bytes` each."""
    from datasets.table import table_cast

    schema = sh.schema_from_json(head.schema) if sub == DATA_DIR else REJECTED_SCHEMA
    out: list[ShardInfo] = []
    for chunk in _chunks(group, target_bytes):
        tables, keys = [], []
        for info in chunk:
            path = store.shard_path(head.dataset, info, head.version)
            # Never launder damage into a fresh checksum: each input is checked first.
            problem = sh.check_shard(path, info, checksum=True)
            if problem is not None:
                raise CorruptionError(f"cannot compact {head.dataset!r}: {problem}. Run "
                                      f"`dyngen verify {head.dataset}`.")
            table = sh.open_table(path).table
            tables.append(table if table.schema.equals(schema, check_metadata=False)
                          else table_cast(table, schema))
            if info.keys is not None:
                key_path = store.shard_path(head.dataset, info, head.version, rel=info.keys)
                keys.append(np.fromfile(key_path, dtype="<u8"))
        merged = pa.concat_tables(tables).combine_chunks()
        with_keys = len(keys) == len(chunk) and sub == DATA_DIR
        sidecar = vec = None
        if sub == DATA_DIR:
            sidecar = merged_sidecar(store, head.dataset, chunk, head.version)
            vec = merged_sidecar(store, head.dataset, chunk, head.version, VECTORS)
        out += store.write_shard(head.dataset, sub, merged,
                                 keys=np.concatenate(keys) if with_keys else None, lsh=sidecar,
                                 vec=vec)
    return tuple(out)


def _chunks(group: tuple[ShardInfo, ...], target_bytes: int) -> list[tuple[ShardInfo, ...]]:
    """Consecutive inputs grouped so each output stays near `target_bytes`."""
    chunks: list[list[ShardInfo]] = [[]]
    size = 0
    for info in group:
        if chunks[-1] and size + info.bytes > target_bytes:
            chunks.append([])
            size = 0
        chunks[-1].append(info)
        size += info.bytes
    return [tuple(c) for c in chunks]


def _remove(store: StoreWriter, name: str, infos: list[ShardInfo]) -> None:
    for info in infos:
        for rel in info.files:
            store.backend.delete(store.shard_rel(name, info, rel=rel))
