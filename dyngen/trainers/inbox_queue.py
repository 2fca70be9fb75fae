"""The local retry queue: batch ends a store could not take, until it can.

A trainer writes each batch end into its dataset's inbox in the store
(`Store.write_batch_end`) before it sends the event. When the store cannot be reached
(object storage down, a full disk, a folder it may not write), the batch end waits here,
on the trainer's disk, and the next emit for that store (or `dyngen emit --flush`)
writes it, before its own:

    <outbox root>/inbox-queue/<store key>/
        store.txt                       the store's root, for people and `--flush`
        .lock                           one process writes a store's queue at a time
        <dataset>/<run>/<step>.json     one batch end: run, step, metrics, event id
        <dataset>/<run>/<step>.<hex>.jsonl   its rollouts, copied here (written first)
        .refused/...                    batch ends the store refused (kept, not retried)

<store key> is a hash of the store's root; <run> the run id as one file name and <step> 20
digits, as in the store's inbox; the outbox root is `$DYNGEN_OUTBOX`, else the user's
cache folder (dyngen.trainers.outbox). One file per (dataset, run, step): a batch end
queued twice keeps the first, as the store does. Writing one the store took meanwhile is
harmless: an entry is created exclusively, and a re-send writes nothing. The queue's
order is (dataset, run, step): a run's steps reach the store in order.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from dyngen.errors import DyngenError
from dyngen.store.backend import durable_temp
from dyngen.store.covered import decode_run, encode_run
from dyngen.store.inbox_input import jsonl_rows, rollouts_payload
from dyngen.store.location import absolute_root
from dyngen.trainers.outbox import default_root, file_lock, max_events

QUEUE_DIR = "inbox-queue"
REFUSED_DIR = ".refused"
ROOT_NOTE = "store.txt"
ITEM_FORMAT = 1
LOCK_WAIT_SECONDS = 0.5
_ITEM = re.compile(r"(\d{20})\.json")

logger = logging.getLogger(__name__)
_full_warned: set[Path] = set()


def retryable(exc: BaseException) -> bool:
    """Whether a failed store write may succeed later: the store was not reached (an
    OSError, a filesystem client's own error), not a batch end it refused as malformed."""
    return isinstance(exc, OSError) or not isinstance(exc, DyngenError)


def store_key(root: str | os.PathLike[str]) -> str:
    """The queue folder's name for a store root (a resolved path, or the URL)."""
    return hashlib.sha256(absolute_root(root).rstrip("/").encode()).hexdigest()[:16]


@dataclass(frozen=True)
class QueuedBatchEnd:
    """A batch end waiting in the queue, as `Store.write_batch_end` takes it."""

    path: Path
    dataset: str
    run: str
    step: int
    metrics: dict[str, float]
    event_id: str
    rollouts: Any  # None, rows (a list), or the path of the copied JSONL file
    rollouts_file: Path | None


@dataclass(frozen=True)
class Flushed:
    """What a flush did: batch ends written to the store, and those still queued."""

    written: int = 0
    pending: int = 0
    reason: str = ""  # why it stopped early (empty when it wrote them all)


class InboxQueue:
    """Batch ends waiting for one store each, on local disk."""

    def __init__(self, root: str | os.PathLike[str] | None = None,
                 limit: int | None = None) -> None:
        self.root = Path(root) if root is not None else default_root() / QUEUE_DIR
        self.limit = limit if limit is not None else max_events()

    def folder(self, store_root: str | os.PathLike[str]) -> Path:
        """The folder of the batch ends queued for the store at `store_root`."""
        return self.root / store_key(store_root)

    def pending(self, store_root: str | os.PathLike[str]) -> list[Path]:
        """The queued batch ends of a store, by (dataset, run, step)."""
        folder = self.folder(store_root)
        if not folder.is_dir():
            return []
        found = [p for p in folder.glob("*/*/*.json") if _ITEM.fullmatch(p.name)]
        return sorted(found, key=lambda p: (p.parent.parent.name, p.parent.name, p.name))

    def roots(self) -> list[str]:
        """The store roots that have a queue folder (from each folder's store.txt)."""
        if not self.root.is_dir():
            return []
        out = []
        for folder in sorted(self.root.iterdir()):
            with contextlib.suppress(OSError):
                out.append((folder / ROOT_NOTE).read_text(encoding="utf-8").strip())
        return [r for r in out if r]

    # ---- queueing ---------------------------------------------------------------------
    def put(self, store_root: str | os.PathLike[str], dataset: str, run: str, step: int,
            metrics: Mapping[str, float], rollouts: Any, event_id: str) -> Path | None:
        """Queue a batch end (its rollouts copied); the file kept, or None if the queue is
        full. BatchEndError when the rollouts cannot be read (nothing is queued)."""
        folder = self.folder(store_root)
        item_dir = folder / dataset / encode_run(run)
        final = item_dir / f"{step:020d}.json"
        if final.exists():
            return final  # queued before: the first is kept, as the store keeps it
        queued = len(self.pending(store_root))
        if queued >= self.limit:
            self._warn_full(folder, queued)
            return None
        payload, _ = rollouts_payload(rollouts)
        item_dir.mkdir(parents=True, exist_ok=True)
        note = folder / ROOT_NOTE
        if not note.exists():
            note.write_text(absolute_root(store_root) + "\n", encoding="utf-8")
        copied = None
        if payload is not None:
            copied = item_dir / f"{step:020d}.{uuid.uuid4().hex}.jsonl"
            os.link(durable_temp(copied, payload), copied)
        kind = None if payload is None else (
            "file" if isinstance(rollouts, (str, os.PathLike)) else "rows")
        record = {"format": ITEM_FORMAT, "store": absolute_root(store_root),
                  "dataset": dataset, "run": run, "step": step, "metrics": dict(metrics),
                  "event_id": event_id,
                  "rollouts": None if copied is None else {"kind": kind, "file": copied.name},
                  "queued_at": datetime.now(timezone.utc).isoformat(timespec="milliseconds")}
        tmp = durable_temp(final, json.dumps(record).encode())
        try:
            os.link(tmp, final)
        except FileExistsError:  # queued meanwhile by another process: theirs is kept
            if copied is not None:
                copied.unlink(missing_ok=True)
        finally:
            tmp.unlink(missing_ok=True)
        _full_warned.discard(folder)
        return final

    # ---- writing them -----------------------------------------------------------------
    def flush(self, store: Any, *, budget_seconds: float | None = None) -> Flushed:
        """Write a store's queued batch ends into it, in order; stop at the first the store
        cannot take (it is down: the rest would fail alike) or when the budget is spent."""
        root = str(store.root)
        if not self.pending(root):
            return Flushed()
        deadline = None if budget_seconds is None else time.monotonic() + budget_seconds
        with file_lock(self.folder(root) / ".lock", LOCK_WAIT_SECONDS) as locked:
            if not locked:
                return Flushed(0, len(self.pending(root)), "another process is writing them")
            written = 0
            for path in self.pending(root):
                if deadline is not None and time.monotonic() > deadline:
                    return Flushed(written, len(self.pending(root)), "time budget spent")
                item = self._read(path)
                if item is None:
                    continue
                try:
                    store.write_batch_end(item.dataset, item.run, item.step, item.metrics,
                                          item.rollouts, event_id=item.event_id)
                except Exception as exc:
                    if retryable(exc):
                        return Flushed(written, len(self.pending(root)),
                                       f"{type(exc).__name__}: {exc}")
                    self._refuse(item, exc)
                    continue
                _remove(item)
                written += 1
        return Flushed(written, len(self.pending(root)))

    def _read(self, path: Path) -> QueuedBatchEnd | None:
        """A queued batch end, or None (a damaged file is set aside, and said)."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            run = decode_run(path.parent.name)
            if (data.get("dataset"), data.get("run"), data.get("step")) != \
                    (path.parent.parent.name, run, int(path.stem)):
                raise ValueError("its dataset, run or step is not the one its place says")
            rollouts, copied = None, None
            if data.get("rollouts") is not None:
                copied = path.with_name(str(data["rollouts"]["file"]))
                rollouts = copied if data["rollouts"]["kind"] == "file" else \
                    jsonl_rows(copied.read_bytes())
            return QueuedBatchEnd(path, data["dataset"], data["run"], data["step"],
                                  dict(data["metrics"]), str(data["event_id"]), rollouts,
                                  copied)
        except FileNotFoundError:
            if not path.exists():
                return None  # written by another flush meanwhile
            why = "its rollouts file is missing"
        except (OSError, ValueError, TypeError, KeyError, AttributeError, DyngenError) as exc:
            why = f"{type(exc).__name__}: {exc}"
        kept = _set_aside(self.folder_of(path), path, [])
        logger.warning("dyngen: queued batch end %s is damaged (%s); it is not written to the "
                       "store, and kept in %s", path, why, kept)
        return None

    def folder_of(self, path: Path) -> Path:
        """The store folder a queued file is in."""
        return path.parent.parent.parent

    def _refuse(self, item: QueuedBatchEnd, exc: BaseException) -> None:
        extra = [item.rollouts_file] if item.rollouts_file is not None else []
        kept = _set_aside(self.folder_of(item.path), item.path, extra)
        logger.warning("dyngen: the store refused queued batch end of %r run %r step %d (%s); "
                       "it is kept in %s and not written again", item.dataset, item.run,
                       item.step, exc, kept)

    def _warn_full(self, folder: Path, count: int) -> None:
        if folder in _full_warned:
            return
        _full_warned.add(folder)
        logger.warning("dyngen: the local retry queue %s holds %d batch ends, its limit; later "
                       "ones that cannot reach the store are not kept until it drains. Make "
                       "the store reachable, then run `dyngen emit --flush`, or raise "
                       "DYNGEN_OUTBOX_MAX_EVENTS.", folder, count)


def _remove(item: QueuedBatchEnd) -> None:
    """Forget a batch end the store holds now (its file first: never an item without its
    rollouts), and the folders it leaves empty."""
    item.path.unlink(missing_ok=True)
    if item.rollouts_file is not None:
        item.rollouts_file.unlink(missing_ok=True)
    for folder in (item.path.parent, item.path.parent.parent):
        with contextlib.suppress(OSError):
            folder.rmdir()


def _set_aside(folder: Path, path: Path, extra: list[Path]) -> Path:
    """Move a queued file (and its rollouts) under .refused/, keeping its place."""
    target = folder / REFUSED_DIR / path.relative_to(folder)
    target.parent.mkdir(parents=True, exist_ok=True)
    for source in [*extra, path]:
        with contextlib.suppress(FileNotFoundError):
            source.rename(target.parent / source.name)
    return target
