"""A durable local outbox: batch-end events wait here while the Prefect server is away.

An event goes through the outbox when it is the only record of its batch end (no store,
or one that refused the batch end). With a store, the batch end is in the store's inbox and
its event only wakes a round: it is sent once and never queued here
(dyngen.trainers.events).

One folder per server address under the outbox root (`$DYNGEN_OUTBOX`, else the user's
cache folder), one JSON file per event, named so that names sort in the order the events
were queued. `deliver` sends the queued events of that server first, in order, in
batches (`POST /api/events`), and removes each file once the server answered 2xx: a crash
in between sends it again, which is harmless because the trigger's event id is the round's
idempotency key. A file lock makes processes sharing an outbox deliver one at a time, so
no event goes out twice in a normal run. No call waits more than a few seconds, so a
training step is never held up.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from dyngen.locations import user_cache
from dyngen.server.auth import auth_headers, credentials_problem

OUTBOX_ENV = "DYNGEN_OUTBOX"
MAX_EVENTS_ENV = "DYNGEN_OUTBOX_MAX_EVENTS"
DEFAULT_MAX_EVENTS = 10_000
BATCH_EVENTS = 100  # events per POST: a long backlog costs a few requests, not thousands
CONNECT_TIMEOUT_SECONDS = 1.0
SEND_TIMEOUT_SECONDS = 2.0
LOCK_WAIT_SECONDS = 1.0
# An emit stops draining a backlog after this long and queues its own event behind the
# rest: the next emit (or `dyngen emit --flush`) goes on where it stopped.
FLUSH_BUDGET_SECONDS = 1.5
REFUSED_DIR = "refused"  # events the server refused as malformed: kept, never sent again

Status = Literal["sent", "queued", "dropped"]
logger = logging.getLogger(__name__)
_full_warned: set[Path] = set()  # outbox folders this process said are full (once each)
_last_name = 0  # the newest file name this process wrote: names only increase


@dataclass(frozen=True)
class Delivery:
    """What became of an event: sent to the server, queued in the outbox, or dropped (the
    outbox is full, or the server refused it as malformed)."""

    status: Status
    delivered: int = 0  # events the server took in this call, earlier queued ones included
    pending: int = 0  # events of this server still in the outbox afterwards
    reason: str = ""  # why the server did not take them (empty when it did)
    unauthorized: bool = False  # the server refused this client's credentials


def default_root() -> Path:
    """$DYNGEN_OUTBOX, else `dyngen/outbox` in the user's cache folder."""
    if os.environ.get(OUTBOX_ENV):
        return Path(os.environ[OUTBOX_ENV]).expanduser()
    return user_cache("outbox")


def max_events() -> int:
    """The outbox limit per server ($DYNGEN_OUTBOX_MAX_EVENTS, default 10,000)."""
    try:
        return max(1, int(os.environ.get(MAX_EVENTS_ENV, DEFAULT_MAX_EVENTS)))
    except ValueError:
        return DEFAULT_MAX_EVENTS


class SendError(Exception):
    """The server did not take a batch of events (unreachable, or not a 2xx answer)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status

    @property
    def unauthorized(self) -> bool:
        """The server refused the credentials: resending with the right ones will do."""
        return self.status in (401, 403)

    @property
    def refused(self) -> bool:
        """The server answered that the request itself is bad: resending will not help."""
        return self.status is not None and 400 <= self.status < 500 \
            and self.status not in (408, 409, 429) and not self.unauthorized


class Outbox:
    """Events waiting for one Prefect server each, on local disk."""

    def __init__(self, root: str | os.PathLike[str] | None = None,
                 limit: int | None = None) -> None:
        self.root = Path(root) if root is not None else default_root()
        self.limit = limit if limit is not None else max_events()

    def folder(self, api_url: str) -> Path:
        """The folder holding the events queued for `api_url`."""
        key = hashlib.sha256(api_url.rstrip("/").encode()).hexdigest()[:16]
        return self.root / key

    def pending(self, api_url: str) -> list[Path]:
        """The queued event files of a server, oldest first."""
        folder = self.folder(api_url)
        if not folder.is_dir():
            return []
        return sorted(p for p in folder.iterdir() if p.suffix == ".json")

    def deliver(self, api_url: str, event: Mapping[str, Any] | None = None) -> Delivery:
        """Send the server's queued events in order, then `event`; queue what is not sent."""
        with self._locked(api_url) as locked:
            if not locked:  # another process is delivering: keep the order, queue behind it
                return self._queue_or_drop(api_url, event, "another process is delivering")
            files: list[Path | None] = [*self.pending(api_url)]
            if event is not None:
                files.append(None)  # None stands for `event`, sent in the last batch
            taken, own, stopped = self._send_in_order(api_url, files, event)
            if stopped is not None:
                if event is None:
                    return Delivery("queued", taken, len(self.pending(api_url)),
                                    str(stopped), stopped.unauthorized)
                return self._queue_or_drop(api_url, event, str(stopped), taken,
                                           stopped.unauthorized)
            if event is not None and not own:
                return Delivery("dropped", taken, len(self.pending(api_url)),
                                "the server refused it (kept in the outbox's refused/)")
            return Delivery("sent", taken, len(self.pending(api_url)))

    def _send_in_order(self, api_url: str, files: list[Path | None],
                       event: Mapping[str, Any] | None
                       ) -> tuple[int, bool, SendError | None]:
        """Send in batches, oldest first, within the budget, removing each queued file the
        server took; (events it took, whether `event` was one, why it stopped)."""
        deadline = time.monotonic() + FLUSH_BUDGET_SECONDS
        taken, own = 0, False
        for start in range(0, len(files), BATCH_EVENTS):
            if start and time.monotonic() > deadline:
                return taken, own, SendError("the rest waits for the next emit (time budget)")
            batch = []
            for path in files[start:start + BATCH_EVENTS]:
                read = event if path is None else _read(path)
                if read is not None:
                    batch.append((path, read))
            if not batch:
                continue
            stopped = None
            try:
                send_events(api_url, [e for _, e in batch])
                done = [path for path, _ in batch]
            except SendError as exc:
                if not exc.refused:
                    return taken, own, exc
                # One bad event must not hold back the rest: send them one by one.
                done, stopped = self._send_singly(api_url, batch)
            for path in done:  # only now: a crash before this line sends them again
                if path is None:
                    own = True
                else:
                    path.unlink(missing_ok=True)
            taken += len(done)
            if stopped is not None:
                return taken, own, stopped
        return taken, own, None

    def _send_singly(self, api_url: str, batch: list[tuple[Path | None, Mapping[str, Any]]]
                     ) -> tuple[list[Path | None], SendError | None]:
        """Send each event alone; set one the server refuses aside in refused/, and say so.
        (The ones the server took, why it stopped.)"""
        done: list[Path | None] = []
        for path, event in batch:
            try:
                send_events(api_url, [event])
            except SendError as exc:
                if not exc.refused:
                    return done, exc
                kept = self._set_aside(api_url, path, event)
                logger.warning("dyngen: the Prefect server refused batch-end event %s (%s); "
                               "it is kept in %s and not sent again", _describe(event), exc,
                               kept)
                continue
            done.append(path)
        return done, None

    def _set_aside(self, api_url: str, path: Path | None, event: Mapping[str, Any]) -> Path:
        """Keep a refused event in refused/ (moved there, when it was queued)."""
        if path is None:
            return self._write(api_url, event, sub=REFUSED_DIR)
        target = self.folder(api_url) / REFUSED_DIR / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            path.rename(target)
        return target

    def _queue_or_drop(self, api_url: str, event: Mapping[str, Any] | None, reason: str,
                       delivered: int = 0, unauthorized: bool = False) -> Delivery:
        if event is None:
            return Delivery("queued", delivered, len(self.pending(api_url)), reason,
                            unauthorized)
        queued = self.pending(api_url)
        if len(queued) >= self.limit:
            self._warn_full(api_url, event, len(queued))
            return Delivery("dropped", delivered, len(queued), reason, unauthorized)
        self._write(api_url, event)
        _full_warned.discard(self.folder(api_url))
        return Delivery("queued", delivered, len(queued) + 1, reason, unauthorized)

    def _write(self, api_url: str, event: Mapping[str, Any], sub: str = "") -> Path:
        folder = self.folder(api_url) / sub if sub else self.folder(api_url)
        folder.mkdir(parents=True, exist_ok=True)
        server_note = folder / "server.txt"
        if not server_note.exists():
            server_note.write_text(api_url + "\n")
        # Names sort in queueing order: nanoseconds, strictly increasing within a process.
        global _last_name
        _last_name = max(time.time_ns(), _last_name + 1)
        name = f"{_last_name:020d}-{os.getpid()}"
        tmp = folder / f".{name}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(event, fh)
            fh.flush()
            os.fsync(fh.fileno())  # a queued event survives a power loss, not just a crash
        final = folder / f"{name}.json"
        os.replace(tmp, final)
        return final

    def _warn_full(self, api_url: str, event: Mapping[str, Any], count: int) -> None:
        if self.folder(api_url) in _full_warned:
            return
        _full_warned.add(self.folder(api_url))
        logger.warning(
            "dyngen: the outbox %s holds %d events for %s, its limit (%s); this batch end "
            "(%s) and later ones are dropped until it drains. Start the server, then run "
            "`dyngen emit --flush`, or raise %s.", self.folder(api_url), count, api_url,
            self.limit, _describe(event), MAX_EVENTS_ENV)

    def _locked(self, api_url: str) -> contextlib.AbstractContextManager[bool]:
        """Hold the server folder's lock (waiting up to LOCK_WAIT_SECONDS); yield success."""
        folder = self.folder(api_url)
        folder.mkdir(parents=True, exist_ok=True)
        return file_lock(folder / ".lock")


@contextlib.contextmanager
def file_lock(path: Path, wait_seconds: float = LOCK_WAIT_SECONDS) -> Iterator[bool]:
    """Hold an exclusive lock on `path` (waiting up to `wait_seconds`); yield success."""
    with open(path, "a+") as fh:
        deadline = time.monotonic() + wait_seconds
        while True:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    yield False
                    return
                time.sleep(0.01)
        try:
            yield True
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


_clients: dict[int, Any] = {}


def _http_client() -> Any:
    """One HTTP client per process (a new one costs ~50 ms; a fork must not share one)."""
    import httpx

    pid = os.getpid()
    if pid not in _clients:
        _clients[pid] = httpx.Client(timeout=httpx.Timeout(SEND_TIMEOUT_SECONDS,
                                                           connect=CONNECT_TIMEOUT_SECONDS))
    return _clients[pid]


def send_events(api_url: str, events: list[Mapping[str, Any]],
                timeout: float | None = None) -> None:
    """POST events to the server; raise SendError unless it answered 2xx. `timeout`
    (seconds) overrides SEND_TIMEOUT_SECONDS for this request."""
    import httpx

    limit = httpx.USE_CLIENT_DEFAULT if timeout is None else httpx.Timeout(
        timeout, connect=min(timeout, CONNECT_TIMEOUT_SECONDS))
    try:
        response = _http_client().post(f"{api_url.rstrip('/')}/events", json=list(events),
                                       headers=auth_headers(), timeout=limit)
    except httpx.HTTPError as exc:
        raise SendError(f"the Prefect server at {api_url} is unreachable "
                        f"({type(exc).__name__})") from exc
    if response.status_code in (401, 403):
        raise SendError(credentials_problem(api_url, response.status_code),
                        response.status_code)
    if not response.is_success:
        raise SendError(f"the Prefect server at {api_url} answered HTTP "
                        f"{response.status_code}: {response.text[:200]}", response.status_code)


def _read(path: Path) -> dict[str, Any] | None:
    """A queued event, or None: gone meanwhile, unreadable now (skipped, and said), or
    not an event (removed, and said)."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except OSError as exc:
        logger.warning("dyngen: outbox file %s cannot be read (%s); it is skipped", path, exc)
        return None
    except ValueError as exc:
        value, why = None, str(exc)
    else:
        if isinstance(value, dict):
            return value
        why = f"a JSON {type(value).__name__}, not an event"
    logger.warning("dyngen: outbox file %s is not an event (%s); it is removed", path, why)
    with contextlib.suppress(OSError):
        path.unlink()
    return None


def _describe(event: Mapping[str, Any]) -> str:
    payload = event.get("payload") if isinstance(event.get("payload"), dict) else {}
    trigger = payload.get("trigger") if isinstance(payload.get("trigger"), dict) else {}
    resource = event.get("resource") if isinstance(event.get("resource"), dict) else {}
    return f"dataset {resource.get('dyngen.dataset')!r} step {trigger.get('step')}"
