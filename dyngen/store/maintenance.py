"""Store maintenance: `verify` reports every defect, `gc` removes unreferenced files."""

from __future__ import annotations

import time
from dataclasses import dataclass

import pyarrow as pa

from dyngen.errors import CorruptionError, StoreError
from dyngen.progress import QUIET, Bar
from dyngen.store import inbox, lsh, vectors
from dyngen.store import shards as sh
from dyngen.store.log import CHECKPOINTS_DIR, VERSIONS_DIR, VersionLog
from dyngen.store.reader import REJECTED_SCHEMA, StoreReader
from dyngen.store.records import LogEntry, ShardInfo
from dyngen.store.retention import DEFAULT_GRACE_SECONDS, live_files, protected_from, sweep
from dyngen.store.state import LogState, apply

DEFAULT_GC_GRACE_SECONDS = DEFAULT_GRACE_SECONDS


@dataclass(frozen=True)
class Problem:
    """One defect found by `verify`: where it is and what is wrong."""

    version: int | None
    path: str
    message: str

    def __str__(self) -> str:
        where = f"v{self.version}" if self.version is not None else "-"
        return f"[{where}] {self.path}: {self.message}"


def verify(store: StoreReader, name: str, progress: Bar = QUIET) -> list[Problem]:
    """Check every record, checkpoint, key marker and shard; return all problems.

    Streams through the log: memory holds one version's state and the shards seen.
    """
    fresh = store.fresh()  # bypass cached records: verify reads what is stored now
    log = fresh.log(name)
    numbers = log.versions()
    if not numbers:
        return [Problem(None, f"{fresh.dataset_dir(name)}/{VERSIONS_DIR}",
                        "no committed version")]
    problems: list[Problem] = []
    if numbers != list(range(len(numbers))):
        missing = sorted(set(range(numbers[-1] + 1)) - set(numbers))
        problems.append(Problem(None, VERSIONS_DIR, f"versions missing from the log: {missing}"))
    head = numbers[-1]
    expired_before, markers_expected = _head_facts(log, head)
    checkpoints = set(log.checkpoint_versions())
    checked: dict[str, str | None] = {}
    state: LogState | None = None
    progress.stage(f"verifying {name}", len(numbers), "versions")
    for n in numbers:
        progress.advance()
        try:
            entry = log.entry(n, cache=False)  # streamed: memory stays flat
        except (StoreError, OSError) as exc:
            problems.append(Problem(n, f"{VERSIONS_DIR}/{n:020d}.json", str(exc)))
            state = None
            continue
        try:
            state = apply(state if state is None or state.version == n - 1 else None, entry)
        except CorruptionError:
            state = None  # its parent is damaged (reported): check what it names itself
        problems += _check_record(entry, state)
        if n in checkpoints and state is not None:
            problems += _check_checkpoint(log, state)
        if markers_expected and n < head and entry.idempotency_key is not None \
                and log.marked_version(entry.idempotency_key) != n:
            problems.append(Problem(n, log.key_rel(entry.idempotency_key).split("/", 1)[1],
                                    "the idempotency key's marker is missing or names another "
                                    "version; a re-delivered trigger could commit twice"))
        if n < expired_before:
            continue  # retention removed its shards on purpose
        named = state.shards if state is not None else entry.added
        quarantine = state.quarantine if state is not None else entry.rejected
        for info, schema in [(s, entry.schema) for s in named] + [(s, None) for s in quarantine]:
            if info.path not in checked:
                checked[info.path] = _check_shard(fresh, name, n, info, schema)
                if checked[info.path] is not None:
                    problems.append(Problem(n, info.path, checked[info.path] or ""))
    return problems


def _head_facts(log: VersionLog, head: int) -> tuple[int, bool]:
    """Versions retention expired, and whether key markers are kept (format 2 head)."""
    try:
        return log.state(head).expired_before, log.entry(head).format >= 2
    except (StoreError, OSError):
        return 0, False  # the head itself is damaged: check everything


def _check_record(entry: LogEntry, state: LogState | None) -> list[Problem]:
    path = f"{VERSIONS_DIR}/{entry.version:020d}.json"
    out = []
    expected_parent = None if entry.version == 0 else entry.version - 1
    if entry.parent != expected_parent:
        out.append(Problem(entry.version, path,
                           f"parent is {entry.parent}, expected {expected_parent}"))
    if state is not None:
        total = sum(s.rows for s in state.shards)
        if entry.rows != total:
            out.append(Problem(entry.version, path,
                               f"rows is {entry.rows}, its shards hold {total}"))
    return out


def _check_checkpoint(log: VersionLog, state: LogState) -> list[Problem]:
    path = f"{CHECKPOINTS_DIR}/{state.version:020d}.json"
    try:
        saved = log.read_checkpoint(state.version)
    except (CorruptionError, OSError) as exc:
        return [Problem(state.version, path, str(exc))]
    if not saved.same_as(state):
        return [Problem(state.version, path, "differs from replaying the records; delete it "
                        "(it is only an optimisation: reads fall back to replay)")]
    return []


def _check_shard(store: StoreReader, name: str, version: int, info: ShardInfo,
                 schema_json: dict | None) -> str | None:
    try:
        path = store.shard_path(name, info, version)
        stored = store.backend.stat(store.shard_rel(name, info, version))
    except CorruptionError as exc:
        return str(exc)
    except FileNotFoundError:
        return f"shard {info.path} is missing"
    if stored.size != info.bytes:  # the stored file itself, not a cached copy
        return f"shard {info.path} has {stored.size} bytes, its record says {info.bytes}"
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
            size = store.shard_path(name, info, version, rel=info.keys).stat().st_size
        except (CorruptionError, OSError) as exc:
            return f"prompt keys {info.keys} are unusable ({exc})"
        if size != 8 * info.rows:
            return f"prompt keys {info.keys} hold {size // 8} keys, the shard has {info.rows} rows"
    if info.lsh is not None:
        problem = _check_sidecar(store, name, version, info)
        if problem is not None:
            return problem
    if info.vec is not None:
        problem = _check_vectors(store, name, version, info)
        if problem is not None:
            return problem
    if schema_json is None:  # a quarantine shard
        fits = table.schema.equals(REJECTED_SCHEMA, check_metadata=False)
    else:  # a data shard, possibly written before the version added extra_info fields
        fits = sh.evolves_to(table.schema, sh.schema_from_json(schema_json))
    if not fits:
        return f"schema differs from the version's schema: found {table.schema}"
    return None


def _check_sidecar(store: StoreReader, name: str, version: int, info: ShardInfo) -> str | None:
    """What is wrong with a shard's own near-duplicate sidecar, or None."""
    try:
        sidecar = lsh.read(store.shard_path(name, info, version, rel=info.lsh))
    except (CorruptionError, OSError) as exc:
        return f"near-duplicate sidecar {info.lsh} is unusable ({exc})"
    if sidecar.header.get("rows") != info.rows:
        return (f"near-duplicate sidecar {info.lsh} indexes {sidecar.header.get('rows')} rows, "
                f"the shard has {info.rows}")
    if len(sidecar.rows) and int(sidecar.rows.max()) >= info.rows:
        return f"near-duplicate sidecar {info.lsh} names rows beyond the shard's {info.rows}"
    return None


def _check_vectors(store: StoreReader, name: str, version: int, info: ShardInfo) -> str | None:
    """What is wrong with a shard's own semantic sidecar, or None."""
    try:
        sidecar = vectors.read(store.shard_path(name, info, version, rel=info.vec))
    except (CorruptionError, OSError) as exc:
        return f"semantic sidecar {info.vec} is unusable ({exc})"
    if sidecar.rows != info.rows:
        return f"semantic sidecar {info.vec} indexes {sidecar.rows} rows, the shard has {info.rows}"
    return None


def gc(store: StoreReader, name: str, *, grace_seconds: float = DEFAULT_GC_GRACE_SECONDS,
       dry_run: bool = False) -> list[str]:
    """Remove shards no kept version names, temp files and inbox rollouts no entry names,
    if older than `grace_seconds`.

    The grace period protects a round in flight: its shard exists before its commit.
    Refuses to run when a record it needs is unreadable, since it could not tell live data.
    """
    fresh = store.fresh()
    head = fresh.state(name)
    now = time.time()
    live = live_files(fresh, name,
                      protected_from(fresh, name, head.expired_before, grace_seconds, now))
    removed = sweep(fresh, name, live, grace_seconds, now, dry_run=dry_run)
    return removed + inbox.sweep(fresh.backend, name, grace_seconds, now, dry_run=dry_run)
