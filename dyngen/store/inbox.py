"""The inbox of a dataset: the batch ends trainers wrote, one immutable entry each.

    <dataset>/_inbox/<run>/<step>.json          one entry per (training run, step)
    <dataset>/_inbox/<run>/<step>.<hex>.jsonl   its rollouts, when too large to inline

<run> is the run id encoded as one file name (`covered.encode_run`), <step> 20 digits. An
entry is created exclusively, with the primitive a version record is committed with
(`Backend.write_new`: a hard link locally, a conditional put on object storage), so it
is never overwritten: a re-sent batch end finds the first one and returns it, saying
which of its fields differ. Large rollouts are written to the store first, as JSONL,
and the entry names them with their hash, so a worker on any host reads them from the
store. Versions name the entries they cover (dyngen/store/covering.py); what no version
covers yet is pending.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from dyngen.errors import CorruptionError
from dyngen.faults import crash_point
from dyngen.store.backend import Backend
from dyngen.store.covered import (
    Covered,
    Key,
    check_run,
    check_step,
    decode_run,
    encode_run,
)
from dyngen.store.inbox_input import check_event_id, check_metrics, jsonl_rows, rollouts_payload
from dyngen.store.names import validate_name

INBOX_DIR = "_inbox"
ENTRY_FORMAT = 1
INLINE_ROLLOUTS_BYTES = 32 * 1024  # larger rollouts go to a JSONL file beside the entry
_ENTRY = re.compile(r"(\d{20})\.json")
_BLOB = re.compile(r"(\d{20})\.[0-9a-f]{32}\.jsonl")


@dataclass(frozen=True)
class Rollouts:
    """A batch end's rollouts: inline rows, or a JSONL file in the store that it names."""

    rows: int
    bytes: int  # of their JSONL form
    sha256: str  # of their JSONL form
    inline: list[Any] | None = None
    path: str | None = None  # relative to the dataset folder

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rows": self.rows, "bytes": self.bytes, "sha256": self.sha256}
        if self.path is not None:
            out["path"] = self.path
        else:
            out["inline"] = self.inline
        return out


@dataclass(frozen=True)
class BatchEnd:
    """One batch end in a dataset's inbox, as stored (`created`, `differs`: what a write did)."""

    dataset: str
    run: str
    step: int
    metrics: Mapping[str, float]
    rollouts: Rollouts | None
    written_at: str  # ISO 8601, UTC, when the entry was created
    event_id: str
    # Set by `write_batch_end` only, not stored: whether this call created the entry, and
    # the fields in which a re-send differed from the entry kept (the first one).
    created: bool = field(default=False, compare=False)
    differs: tuple[str, ...] = field(default=(), compare=False)

    @property
    def key(self) -> Key:
        """(run, step): what a version's `covers` names."""
        return self.run, self.step

    def to_json(self) -> str:
        return json.dumps({
            "format": ENTRY_FORMAT, "dataset": self.dataset, "run": self.run,
            "step": self.step, "metrics": dict(self.metrics),
            "rollouts": None if self.rollouts is None else self.rollouts.to_dict(),
            "written_at": self.written_at, "event_id": self.event_id,
        }, separators=(",", ":"), ensure_ascii=False) + "\n"


# ---- names ---------------------------------------------------------------------------
def run_dir(dataset: str, run: str) -> str:
    """The folder of a run's entries, relative to the store root."""
    return f"{validate_name(dataset)}/{INBOX_DIR}/{encode_run(run)}"


def entry_rel(dataset: str, run: str, step: int) -> str:
    """An entry's path relative to the store root."""
    return f"{run_dir(dataset, run)}/{step:020d}.json"


# ---- writing -------------------------------------------------------------------------
def write_batch_end(backend: Backend, dataset: str, run: str, step: int,
                    metrics: Mapping[str, Any] | None = None, rollouts: Any = None, *,
                    event_id: str | None = None) -> BatchEnd:
    """Create the entry of (run, step) unless it exists; the entry kept, either way."""
    dataset, run, step = validate_name(dataset), check_run(run), check_step(step)
    clean = check_metrics(metrics)
    event_id = check_event_id(event_id)
    payload, count = rollouts_payload(rollouts)
    rel = entry_rel(dataset, run, step)
    digest = None if payload is None else hashlib.sha256(payload).hexdigest()
    existing = read_entry(backend, dataset, run, step)
    if existing is not None:
        return _resent(existing, clean, digest)
    blob = None
    if payload is not None:
        if len(payload) > INLINE_ROLLOUTS_BYTES or isinstance(rollouts, (str, os.PathLike)):
            name = f"{step:020d}.{uuid.uuid4().hex}.jsonl"
            blob = Rollouts(count, len(payload), str(digest),
                            path=f"{INBOX_DIR}/{encode_run(run)}/{name}")
            backend.write_new(f"{dataset}/{blob.path}", payload)
            crash_point("inbox.after_rollouts_write")
        else:
            blob = Rollouts(count, len(payload), str(digest), inline=jsonl_rows(payload))
    written = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
    entry = BatchEnd(dataset, run, step, clean, blob, written, event_id)
    try:
        backend.write_new(rel, entry.to_json().encode(), hook=_entry_stage)
    except FileExistsError:  # another writer created it meanwhile: theirs is kept
        if blob is not None and blob.path is not None:
            backend.delete(f"{dataset}/{blob.path}")
        kept = read_entry(backend, dataset, run, step)
        assert kept is not None  # created, and entries are never removed
        return _resent(kept, clean, digest)
    return replace(entry, created=True)


def _resent(kept: BatchEnd, metrics: dict[str, float], digest: str | None) -> BatchEnd:
    """The entry kept, with the fields a re-send differs in."""
    differs = []
    if dict(kept.metrics) != metrics:
        differs.append("metrics")
    if (kept.rollouts.sha256 if kept.rollouts is not None else None) != digest:
        differs.append("rollouts")
    return replace(kept, created=False, differs=tuple(differs))


def _entry_stage(stage: str) -> None:
    """Crash points of an entry's creation: its temp file written, then its name."""
    crash_point("inbox.before_link" if stage == "written" else "inbox.after_link")


# ---- reading -------------------------------------------------------------------------
def read_entry(backend: Backend, dataset: str, run: str, step: int) -> BatchEnd | None:
    """The entry of (run, step), or None if there is none."""
    rel = entry_rel(dataset, run, step)
    try:
        raw = backend.read_bytes(rel)
    except FileNotFoundError:
        return None
    return parse_entry(raw, backend.describe(rel), dataset, run, step)


def parse_entry(raw: bytes, origin: str, dataset: str, run: str, step: int) -> BatchEnd:
    """An entry's bytes, checked against where it is; CorruptionError if damaged."""
    try:
        data = json.loads(raw.decode("utf-8"))
        if not isinstance(data, dict):
            raise TypeError("expected a JSON object")
        if (data.get("dataset"), data.get("run"), data.get("step")) != (dataset, run, step):
            raise ValueError("its dataset, run or step is not the one its name says")
        metrics = data.get("metrics")
        if not isinstance(metrics, dict) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                for v in metrics.values()):
            raise TypeError("metrics must map names to finite numbers")
        found = data.get("rollouts")
        rollouts = None if found is None else _parse_rollouts(found, run, step)
        written, event = data.get("written_at"), data.get("event_id")
        if not isinstance(written, str) or not isinstance(event, str):
            raise TypeError("written_at and event_id must be text")
    except (UnicodeDecodeError, ValueError, TypeError) as exc:
        raise CorruptionError(f"inbox entry {origin} is damaged ({exc}); entries are written "
                              "once and never changed: it was truncated or overwritten. "
                              "Remove it and have the trainer send that batch end again."
                              ) from None
    return BatchEnd(dataset, run, step, {str(k): float(v) for k, v in metrics.items()},
                    rollouts, written, event)


def _parse_rollouts(data: Any, run: str, step: int) -> Rollouts:
    if not isinstance(data, dict):
        raise TypeError("rollouts must be an object or null")
    rows, size, digest = data.get("rows"), data.get("bytes"), data.get("sha256")
    if type(rows) is not int or type(size) is not int or not isinstance(digest, str):
        raise TypeError("rollouts need rows, bytes and sha256")
    path = data.get("path")
    if path is not None:
        name = path.rsplit("/", 1)[-1] if isinstance(path, str) else ""
        found = _BLOB.fullmatch(name)
        if (path != f"{INBOX_DIR}/{encode_run(run)}/{name}" or found is None
                or int(found.group(1)) != step):
            raise ValueError("its rollouts file is not beside it")
        return Rollouts(rows, size, digest, path=path)
    if not isinstance(data.get("inline"), list):
        raise TypeError("rollouts need a path or inline rows")
    return Rollouts(rows, size, digest, inline=data["inline"])


def read_rollouts(backend: Backend, entry: BatchEnd) -> list[Any]:
    """A batch end's rollouts (empty if it has none), read from the store and checked."""
    if entry.rollouts is None:
        return []
    if entry.rollouts.inline is not None:
        return list(entry.rollouts.inline)
    return jsonl_rows(rollouts_bytes(backend, entry))


def rollouts_bytes(backend: Backend, entry: BatchEnd) -> bytes:
    """A batch end's rollouts as JSONL bytes (one per line), checked against the entry."""
    info = entry.rollouts
    if info is None:
        return b""
    if info.path is None:
        lines = (json.dumps(r, ensure_ascii=False, separators=(",", ":"))
                 for r in info.inline or ())
        return "".join(f"{line}\n" for line in lines).encode()
    rel = f"{entry.dataset}/{info.path}"
    try:
        data = backend.read_bytes(rel)
    except FileNotFoundError:
        data = None
    if data is None or hashlib.sha256(data).hexdigest() != info.sha256:
        problem = "is missing" if data is None else "does not match its hash in the entry"
        raise CorruptionError(f"rollouts {backend.describe(rel)} of {entry.dataset!r} run "
                              f"{entry.run!r} step {entry.step} {problem}; the batch end's "
                              "rollouts cannot be read. Its metrics still can.")
    return data


def runs(backend: Backend, dataset: str) -> dict[str, str]:
    """The runs with a folder in the inbox: run id -> folder name."""
    found = {}
    for name in backend.list_dirs(f"{validate_name(dataset)}/{INBOX_DIR}"):
        run = decode_run(name)
        if run is not None:
            found[run] = name
    return found


def steps(backend: Backend, dataset: str, run: str) -> list[int]:
    """The steps of a run that have an entry, ascending (one listing of its folder)."""
    found = (_ENTRY.fullmatch(n) for n in backend.list(run_dir(dataset, run)))
    return sorted(int(m.group(1)) for m in found if m)


def entry_keys(backend: Backend, dataset: str, covered: Covered | None = None) -> list[Key]:
    """(run, step) of every entry (or, given `covered`, of the pending ones: those it does
    not hold), ascending; listed, none read."""
    return [(run, step) for run in sorted(runs(backend, dataset))
            for step in steps(backend, dataset, run)
            if covered is None or (run, step) not in covered]


def entries(backend: Backend, dataset: str, covered: Covered | None = None) -> list[BatchEnd]:
    """Every entry (or, given `covered`, the pending ones: those it does not hold), by
    (run, step); only those are read."""
    found = (read_entry(backend, dataset, run, step)
             for run, step in entry_keys(backend, dataset, covered))
    return [entry for entry in found if entry is not None]


def orphans(backend: Backend, dataset: str) -> list[str]:
    """Rollouts files no entry names (a writer died between the file and its entry) and
    temp files, relative to the dataset folder."""
    out = []
    for run, folder in sorted(runs(backend, dataset).items()):
        names = backend.list(f"{dataset}/{INBOX_DIR}/{folder}")
        for name in sorted(names):
            found = _BLOB.fullmatch(name)
            if found is None:
                if name.startswith(".tmp-"):
                    out.append(f"{INBOX_DIR}/{folder}/{name}")
                continue
            try:
                entry = read_entry(backend, dataset, run, int(found.group(1)))
            except CorruptionError:
                continue  # a damaged entry may name it: keep it
            rel = f"{INBOX_DIR}/{folder}/{name}"
            if entry is None or entry.rollouts is None or entry.rollouts.path != rel:
                out.append(rel)
    return out


def sweep(backend: Backend, dataset: str, grace: float, now: float, *,
          dry_run: bool = False) -> list[str]:
    """Delete the inbox's orphans older than `grace` seconds (a writer may be between a
    rollouts file and its entry); what was (or would be) deleted."""
    removed = []
    for rel in orphans(backend, dataset):
        try:
            if backend.stat(f"{dataset}/{rel}").mtime > now - grace:
                continue
        except FileNotFoundError:
            continue
        if not dry_run:
            backend.delete(f"{dataset}/{rel}")
        removed.append(rel)
    return removed
