"""Store maintenance: `verify` reports every defect, `gc` removes unreferenced files."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from dyngen.errors import CorruptionError, StoreError
from dyngen.progress import QUIET, Bar
from dyngen.store import shards as sh
from dyngen.store.records import ShardInfo, VersionRecord
from dyngen.store.store import DATA_DIR, REJECTED_DIR, REJECTED_SCHEMA, VERSIONS_DIR, Store

DEFAULT_GC_GRACE_SECONDS = 3600.0


@dataclass(frozen=True)
class Problem:
    """One defect found by `verify`: where it is and what is wrong."""

    version: int | None
    path: str
    message: str

    def __str__(self) -> str:
        where = f"v{self.version}" if self.version is not None else "-"
        return f"[{where}] {self.path}: {self.message}"


def verify(store: Store, name: str, progress: Bar = QUIET) -> list[Problem]:
    """Check every record and every shard it names; return all problems (empty = healthy)."""
    folder = store.dataset_dir(name) / VERSIONS_DIR
    problems: list[Problem] = []
    fresh = Store(store.root)  # bypass cached records: verify reads what is on disk now
    numbers = fresh.versions(name)
    if not numbers:
        return [Problem(None, str(folder), "no committed version")]
    if numbers != list(range(len(numbers))):
        missing = sorted(set(range(numbers[-1] + 1)) - set(numbers))
        problems.append(Problem(None, VERSIONS_DIR, f"versions missing from the log: {missing}"))
    checked: dict[str, str | None] = {}
    progress.stage(f"verifying {name}", len(numbers), "versions")
    for n in numbers:
        progress.advance()
        try:
            rec = fresh.record(name, n)
        except StoreError as exc:
            problems.append(Problem(n, f"{VERSIONS_DIR}/{n:020d}.json", str(exc)))
            continue
        problems += _check_record(rec)
        named = [(s, rec.schema) for s in rec.shards] + [(s, None) for s in rec.rejected]
        for info, schema in named:
            if info.path not in checked:
                checked[info.path] = _check_shard(fresh, name, rec, info, schema)
            if checked[info.path] is not None:
                problems.append(Problem(n, info.path, checked[info.path] or ""))
    return problems


def _check_record(rec: VersionRecord) -> list[Problem]:
    path = f"{VERSIONS_DIR}/{rec.version:020d}.json"
    out = []
    expected_parent = None if rec.version == 0 else rec.version - 1
    if rec.parent != expected_parent:
        out.append(Problem(rec.version, path,
                           f"parent is {rec.parent}, expected {expected_parent}"))
    total = sum(s.rows for s in rec.shards)
    if rec.rows != total:
        out.append(Problem(rec.version, path, f"rows is {rec.rows}, its shards hold {total}"))
    return out


def _check_shard(store: Store, name: str, rec: VersionRecord, info: ShardInfo,
                 schema_json: dict | None) -> str | None:
    try:
        path = store.shard_path(name, info, rec.version)
    except CorruptionError as exc:
        return str(exc)
    problem = sh.check_shard(path, info, checksum=False)
    if problem is None:
        actual = sh.file_sha256(path)
        if actual != info.sha256:
            problem = f"checksum is {actual[:12]}…, the record says {info.sha256[:12]}…"
    if problem is not None:
        return problem
    try:
        with pa.memory_map(str(path)) as source:
            table = pa.ipc.open_stream(source).read_all()
    except (OSError, pa.ArrowException) as exc:
        return f"not a readable Arrow stream ({exc})"
    if table.num_rows != info.rows:
        return f"holds {table.num_rows} rows, the record says {info.rows}"
    if info.keys is not None:
        try:
            size = store.shard_path(name, info, rec.version, rel=info.keys).stat().st_size
        except (CorruptionError, OSError) as exc:
            return f"prompt keys {info.keys} are unusable ({exc})"
        if size != 8 * info.rows:
            return f"prompt keys {info.keys} hold {size // 8} keys, the shard has {info.rows} rows"
    if schema_json is None:  # a quarantine shard
        fits = table.schema.equals(REJECTED_SCHEMA, check_metadata=False)
    else:  # a data shard, possibly written before the version added extra_info fields
        fits = sh.evolves_to(table.schema, sh.schema_from_json(schema_json))
    if not fits:
        return f"schema differs from the version's schema: found {table.schema}"
    return None


def gc(store: Store, name: str, *, grace_seconds: float = DEFAULT_GC_GRACE_SECONDS,
       dry_run: bool = False) -> list[str]:
    """Remove shards and temp files no version names, if older than `grace_seconds`.

    The grace period protects a round in flight: its shard exists before its commit.
    Refuses to run when any record is unreadable, since it could not tell live data.
    """
    base = store.dataset_dir(name)
    fresh = Store(store.root)
    live: set[str] = set()
    for rec in fresh.history(name):
        live.update(f for s in rec.shards + rec.rejected for f in s.files)
    cutoff = time.time() - grace_seconds
    removed = []
    for sub in (DATA_DIR, REJECTED_DIR, VERSIONS_DIR):
        for path in sh.iter_shard_paths(base / sub):
            rel = f"{sub}/{path.name}"
            is_record = sub == VERSIONS_DIR and not path.name.startswith(".tmp-")
            if rel in live or is_record or _mtime(path) > cutoff:
                continue
            if not dry_run:
                path.unlink(missing_ok=True)
            removed.append(rel)
    return removed


def _mtime(path: Path) -> float:
    try:
        return os.stat(path).st_mtime
    except FileNotFoundError:
        return float("inf")
