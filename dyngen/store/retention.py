"""Retention: `vacuum` expires old versions and deletes data files no kept version names.

A vacuum first commits a `vacuum` version that records the decision (which versions
expire, when, by which rule), then deletes. So a crash between the two loses nothing
and a rerun finishes the deletions; loading an expired version fails naming the
vacuum that removed it. Records and lineage are never deleted. Like Iceberg's
`expire_snapshots`, a version is kept when either rule keeps it.

The grace period (gc's) protects rounds in flight twice: a file younger than it is never
deleted (a round may be about to commit it), and the files of a version that was the
head within it stay until it has passed (a round may still be reading that version).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from dyngen.errors import ConfigError
from dyngen.faults import crash_point
from dyngen.store.index import INDEX_DIR
from dyngen.store.log import CHECKPOINTS_DIR, KEYS_DIR, VERSIONS_DIR
from dyngen.store.reader import DATA_DIR, REJECTED_DIR
from dyngen.store.records import PendingCommit, VersionRecord

if TYPE_CHECKING:
    from dyngen.store.reader import StoreReader
    from dyngen.store.writer import StoreWriter

DEFAULT_GRACE_SECONDS = 3600.0
_SECONDS_PER_DAY = 86400.0


@dataclass(frozen=True)
class VacuumResult:
    """What a vacuum did: the version recording it (None if nothing newly expired)."""

    record: VersionRecord | None
    expired_before: int  # versions below this no longer load
    removed: list[str]  # files deleted (or that would be, with dry_run)


def vacuum(store: StoreWriter, name: str, *, keep_versions: int | None = None,
           keep_days: float | None = None, grace_seconds: float | None = None,
           dry_run: bool = False) -> VacuumResult:
    """Expire versions neither rule keeps, then delete the files only they named."""
    grace = DEFAULT_GRACE_SECONDS if grace_seconds is None else float(grace_seconds)
    _check_rules(keep_versions, keep_days, grace)
    now = time.time()
    head = store.state(name)
    boundary = expiry_boundary(store, name, head.version, keep_versions, keep_days, now)
    current = head.expired_before
    record = None
    if boundary > current and not dry_run:

        retention = {"expired_before": boundary, "keep_versions": keep_versions,
                     "keep_days": keep_days}
        record = store.commit_with_rebase(PendingCommit(
            dataset=name, parent=head.version, operation="vacuum",
            schema=head.schema, prompt_key=head.prompt_key,
            lineage={"retention": retention}))
        crash_point("vacuum.after_record")
    expired = max(boundary, current) if dry_run else store.state(name).expired_before
    live = live_files(store, name, protected_from(store, name, expired, grace, now))
    removed = sweep(store, name, live, grace, now, dry_run=dry_run)
    return VacuumResult(record, expired, removed)


def _check_rules(keep_versions: int | None, keep_days: float | None, grace: float) -> None:
    if keep_versions is None and keep_days is None:
        raise ConfigError("vacuum: give --keep-versions N or --keep-days D (or both): how "
                          "much history to keep.")
    if keep_versions is not None and (isinstance(keep_versions, bool)
                                      or not isinstance(keep_versions, int) or keep_versions < 1):
        raise ConfigError(f"vacuum: --keep-versions expects an integer >= 1, found "
                          f"{keep_versions!r}.")
    if keep_days is not None and (isinstance(keep_days, bool) or keep_days < 0):
        raise ConfigError(f"vacuum: --keep-days expects a number >= 0, found {keep_days!r}.")
    if grace < 0:
        raise ConfigError(f"vacuum: the grace period expects seconds >= 0, found {grace!r}.")


def expiry_boundary(store: StoreReader, name: str, head: int, keep_versions: int | None,
                    keep_days: float | None, now: float) -> int:
    """The oldest version to keep loadable: the oldest that either rule keeps."""
    keep = [_newest_but_vacuums(store, name, head, keep_versions)] if keep_versions else []
    if keep_days is not None:
        since = _head_since(store, name, head, now - keep_days * _SECONDS_PER_DAY)
        keep.append(_below_vacuums(store, name, since))
    return max(0, min(keep))


def _below_vacuums(store: StoreReader, name: str, version: int) -> int:
    """The newest version at or below `version` that is not a vacuum: a vacuum changes no
    row, so a rerun (a vacuum now the head) moves the boundary no further."""
    log = store.log(name)
    while version > 0 and log.entry(version).operation == "vacuum":
        version -= 1
    return version


def protected_from(store: StoreReader, name: str, expired_before: int, grace: float,
                   now: float) -> int:
    """The oldest version whose files stay: kept, or the head within `grace` (a round in
    flight may still be reading it, even if it no longer loads)."""
    head = store.log(name).head_version() or 0
    return min(expired_before, _head_since(store, name, head, now - grace))


def _newest_but_vacuums(store: StoreReader, name: str, head: int, count: int) -> int:
    """The oldest of the newest `count` versions, not counting vacuums: a rerun with the
    same rule expires nothing more."""
    log = store.log(name)
    version = head
    while version > 0:
        if log.entry(version).operation != "vacuum":
            count -= 1
            if count == 0:
                break
        version -= 1
    return version


def _head_since(store: StoreReader, name: str, head: int, cutoff: float) -> int:
    """The oldest version that was still the head at `cutoff` (reads back from the head)."""
    log = store.log(name)
    version = head
    while version > 0 and _created(log.entry(version).created_at) >= cutoff:
        version -= 1
    return version


def _created(stamp: str) -> float:
    try:
        moment = datetime.fromisoformat(stamp)
    except ValueError:
        return float("inf")  # unreadable: treat as new, so nothing is expired on a guess
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def live_files(store: StoreReader, name: str, expired_before: int) -> set[str]:
    """Every file a kept version (from `expired_before` to the head) names, streamed."""
    log = store.log(name)
    head = log.head_version()
    if head is None:
        return set()
    live: set[str] = set()
    for _, state in log.replay(expired_before, head):
        live |= state.files
        # A derived sidecar lives as long as its shard: named by the shard's hash.
        live |= {f"{INDEX_DIR}/{s.sha256}" for s in state.shards}
    return live


def sweep(store: StoreReader, name: str, live: set[str], grace: float, now: float, *,
          dry_run: bool = False) -> list[str]:
    """Delete data files (shards, their own files, derived sidecars) not in `live` and temp
    files, both older than `grace`."""
    backend = store.backend
    removed = []
    folders = [DATA_DIR, REJECTED_DIR, INDEX_DIR, VERSIONS_DIR, CHECKPOINTS_DIR]
    folders += [f"{KEYS_DIR}/{d}" for d in sorted(backend.list_dirs(f"{name}/{KEYS_DIR}"))]
    first = True
    for sub in folders:
        for file in sorted(backend.list(f"{name}/{sub}")):
            rel = f"{sub}/{file}"
            data = sub in (DATA_DIR, REJECTED_DIR)
            if sub == INDEX_DIR and not file.startswith(".tmp-"):
                data, rel_live = True, f"{sub}/{file.partition('-')[0]}"
            else:
                rel_live = rel
            if (data and rel_live in live) or (not data and not file.startswith(".tmp-")):
                continue
            try:
                if backend.stat(f"{name}/{rel}").mtime > now - grace:
                    continue  # a round (or compaction) in flight may be about to commit it
            except FileNotFoundError:
                continue
            if not dry_run:
                backend.delete(f"{name}/{rel}")
                if first:
                    crash_point("store.after_first_delete")
                    first = False
            removed.append(rel)
    return removed
