"""One `dyngen serve` per dataset: a lease recorded in the store, the one truth serves share.

    _serve/<dataset>/<generation>.json   the lease of a serve of one dataset (--dataset)
    _serve/_all/<generation>.json        the lease of a serve of every dataset

`_serve` cannot be a dataset's folder (a name starts with a letter or digit). A lease names
its holder: process identity (dyngen.server.identity), host, pid, when it started and
when it last renewed. Taking a lease creates the next generation's file exclusively, with
the primitive a version is committed with (`Backend.write_new`: a hard link locally, a
conditional put on object storage): of two serves taking one lease at once, one wins.

The newest generation is the lease. It is live unless it was released (a serve that ended
cleanly marks its file released, so generations never repeat), its process is gone (told
at once on the holder's machine), or it went `STALE_SECONDS` without renewal (any machine;
its clock against ours). A live lease refuses the next serve, naming the holder; another
one is taken over, saying so. A serve of every dataset and a serve of one dataset refuse
each other: each checks for the other's live lease after creating its own, so two started
together may both refuse, never both serve. The holder renews every `RENEW_SECONDS`; a
renewal that finds a newer generation (a serve that took the lease over while this one was
stalled) says the lease is lost, and the serve stops.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from typing import Any

from dyngen.errors import DyngenError
from dyngen.server.identity import process_is_gone, this_process
from dyngen.store.backend import Backend
from dyngen.store.names import validate_name

logger = logging.getLogger("dyngen.serve")
LEASE_DIR = "_serve"
EVERY_DATASET = "_all"
RENEW_SECONDS = 10.0
STALE_SECONDS = 30.0
_FILE = re.compile(r"(\d{20})\.json")


class ServeBusyError(DyngenError):
    """A live `dyngen serve` already serves this dataset (or the whole store)."""


class LeaseLostError(DyngenError):
    """Another serve took this serve's lease over."""


@dataclass(frozen=True)
class Holder:
    """Who holds a lease, as its file records it."""

    process: str  # its identity, dyngen.server.identity ("" where /proc cannot tell)
    host: str
    pid: int
    dataset: str | None  # None: every dataset of the store
    started_at: str  # ISO 8601, UTC
    renewed_at: str
    released_at: str | None = None

    @classmethod
    def of_this_process(cls, dataset: str | None) -> Holder:
        now = _iso(time.time())
        return cls(this_process(), socket.gethostname(), os.getpid(), dataset, now, now)

    def to_bytes(self) -> bytes:
        return (json.dumps(asdict(self), separators=(",", ":")) + "\n").encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Holder:
        raw = json.loads(data)
        return cls(process=str(raw.get("process") or ""), host=str(raw["host"]),
                   pid=int(raw["pid"]), dataset=raw.get("dataset"),
                   started_at=str(raw["started_at"]), renewed_at=str(raw["renewed_at"]),
                   released_at=raw.get("released_at"))

    def ended(self, now: float) -> str | None:
        """Why this lease no longer holds, or None while it is live."""
        if self.released_at:
            return "released"
        if self.process and process_is_gone(self.process):
            return f"its process (pid {self.pid} on {self.host}) is gone"
        age = now - _seconds(self.renewed_at)
        if age > STALE_SECONDS:
            return f"it was not renewed for {age:.0f} s (pid {self.pid} on {self.host})"
        return None

    def describe(self, now: float) -> str:
        what = f"dataset {self.dataset!r}" if self.dataset else "every dataset"
        return (f"a `dyngen serve` of {what} (pid {self.pid} on host {self.host}, serving "
                f"since {self.started_at[:19]}Z, lease renewed "
                f"{max(0.0, now - _seconds(self.renewed_at)):.0f} s ago)")


class ServeLease:
    """The lease of a serve of `dataset` (None: every dataset) in the store of `backend`."""

    def __init__(self, backend: Backend, dataset: str | None) -> None:
        self.backend = backend
        self.dataset = validate_name(dataset) if dataset is not None else None
        self.key = self.dataset or EVERY_DATASET
        self.generation: int | None = None
        self.holder: Holder | None = None
        self.lost: str | None = None  # why, once another serve took the lease over

    @property
    def where(self) -> str:
        return f"store {self.backend.root}"

    @property
    def _what(self) -> str:
        return f"dataset {self.dataset!r}" if self.dataset else "every dataset"

    def acquire(self, now: Callable[[], float] = time.time) -> str | None:
        """Take the lease, or ServeBusyError naming the live holder (one line); a note when
        this took over a lease that had ended without being released."""
        top, found = self._newest(self.key)
        ended = found.ended(now()) if found is not None else "its file is unreadable"
        if found is not None and ended is None:
            raise self._busy(found, now())
        note = (f"took over the serve lease of {self._what} in {self.where}: {ended}"
                if top is not None and ended != "released" else None)
        self._refuse_conflicts(now())
        generation = 0 if top is None else top + 1
        holder = Holder.of_this_process(self.dataset)
        if not self.backend.create_exclusive(self._rel(self.key, generation),
                                             holder.to_bytes()):
            _, winner = self._newest(self.key)  # another serve took it at the same moment
            raise self._busy(winner or holder, now())
        self.generation, self.holder = generation, holder
        try:
            self._refuse_conflicts(now())  # one started at the same moment with the other kind
        except ServeBusyError:
            self.release()
            raise
        self._forget_older()
        return note

    def renew(self, now: Callable[[], float] = time.time) -> None:
        """Record that this serve is alive; LeaseLostError if another took the lease over."""
        assert self.generation is not None and self.holder is not None, "not acquired"
        if self.lost is None:
            top, found = self._newest(self.key)
            if top is not None and top > self.generation:
                taker = found.describe(now()) if found else "another `dyngen serve`"
                self.lost = (f"the serve lease of {self._what} in {self.where} was taken "
                             f"over by {taker} "
                             f"while this serve did not renew it; this serve stops")
        if self.lost is not None:
            raise LeaseLostError(self.lost)
        self.holder = replace(self.holder, renewed_at=_iso(now()))
        self.backend.replace(self._rel(self.key, self.generation), self.holder.to_bytes())
        self._forget_older()

    def release(self) -> None:
        """Mark the lease released (a clean exit): the next serve takes it at once."""
        if self.generation is None or self.holder is None or self.lost is not None:
            return
        released = replace(self.holder, released_at=_iso(time.time()))
        top, _ = self._newest(self.key)
        if top is None or top <= self.generation:
            self.backend.replace(self._rel(self.key, self.generation), released.to_bytes())
        self.generation = None

    @contextmanager
    def held(self, on_lost: Callable[[str], None],
             say: Callable[[str], None] = print) -> Iterator[ServeLease]:
        """Hold the lease for the block, renewed by a thread; `on_lost(why)` once if it is
        taken over; released when the block ends."""
        note = self.acquire()
        if note:
            say(f"dyngen: {note}")
        stopping = threading.Event()

        def keep() -> None:
            while not stopping.wait(RENEW_SECONDS):
                try:
                    self.renew()
                except LeaseLostError as exc:
                    on_lost(str(exc))
                    return
                except Exception as exc:  # the store out of reach: next time (30 s to spare)
                    logger.warning("could not renew the serve lease of %s: %s", self.where, exc)

        thread = threading.Thread(target=keep, name="dyngen-serve-lease", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stopping.set()
            thread.join(RENEW_SECONDS)  # a renewal under way must not undo the release
            with suppress(OSError):
                self.release()

    # ---- the store's files --------------------------------------------------------------
    @staticmethod
    def _rel(key: str, generation: int) -> str:
        return f"{LEASE_DIR}/{key}/{generation:020d}.json"

    def _generations(self, key: str) -> list[int]:
        return sorted(int(m.group(1)) for name in self.backend.list(f"{LEASE_DIR}/{key}")
                      if (m := _FILE.fullmatch(name)))

    def _newest(self, key: str) -> tuple[int | None, Holder | None]:
        """The newest generation of `key`'s lease and its holder (None if unreadable)."""
        generations = self._generations(key)
        if not generations:
            return None, None
        try:
            data = self.backend.read_bytes(self._rel(key, generations[-1]))
            return generations[-1], Holder.from_bytes(data)
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return generations[-1], None  # torn by hand: not a live lease

    def _refuse_conflicts(self, now: float) -> None:
        """ServeBusyError if a serve of the other kind holds a live lease on this store."""
        keys = ([EVERY_DATASET] if self.dataset is not None else
                [k for k in self.backend.list_dirs(LEASE_DIR) if k != EVERY_DATASET])
        for key in keys:
            top, found = self._newest(key)
            if found is not None and found.ended(now) is None and not self._mine(key, top):
                raise self._busy(found, now)

    def _mine(self, key: str, generation: int | None) -> bool:
        return key == self.key and generation == self.generation

    def _busy(self, holder: Holder, now: float) -> ServeBusyError:
        return ServeBusyError(
            f"cannot serve {self._what} of {self.where}: {holder.describe(now)} is serving "
            f"there; stop that serve first (kill {holder.pid} on {holder.host}); a serve whose "
            f"process is gone, or that has not renewed its lease for {STALE_SECONDS:.0f} s, "
            f"is taken over")

    def _forget_older(self) -> None:
        """Delete this lease's older generations (only the newest counts)."""
        for generation in self._generations(self.key):
            if self.generation is not None and generation < self.generation:
                with suppress(OSError):
                    self.backend.delete(self._rel(self.key, generation))


def store_lease(store: dict[str, Any], dataset: str | None) -> ServeLease:
    """The serve lease of `dataset` in the store `store_settings` names."""
    from dyngen.store.location import open_backend

    return ServeLease(open_backend(store["root"], storage_options=store.get("storage_options"),
                                   single_writer=bool(store.get("single_writer")),
                                   cache_dir=store.get("cache_dir")), dataset)


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="seconds")


def _seconds(iso: str) -> float:
    try:
        return datetime.fromisoformat(iso).timestamp()
    except ValueError:
        return 0.0  # unreadable: as old as can be
