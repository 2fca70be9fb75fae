"""The version log of one dataset: records, checkpoints and idempotency markers.

    <dataset>/_versions/<N>.json          one record per version; its exclusive creation
                                          is the commit (N is 20 digits)
    <dataset>/_checkpoints/<N>.json       the full state of version N, every K versions
    <dataset>/_checkpoints/_last_checkpoint   hint: the newest checkpoint's version
    <dataset>/_keys/<hh>/<hash>.json      idempotency key -> the version that committed it

Reading version N is the newest usable checkpoint at or below N plus the records after
it. Checkpoints and the hint are optimisations written after a commit: a missing or
damaged one only means replaying from an older checkpoint, or from version 0.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

from dyngen.errors import CorruptionError
from dyngen.faults import crash_point
from dyngen.store.backend import Backend
from dyngen.store.records import LogEntry
from dyngen.store.state import LogState, apply

VERSIONS_DIR = "_versions"
CHECKPOINTS_DIR = "_checkpoints"
KEYS_DIR = "_keys"
HINT_NAME = "_last_checkpoint"
DEFAULT_CHECKPOINT_INTERVAL = 25
RECORD_NAME = re.compile(r"(\d{20})\.json")
_ENTRY_CACHE = 4096  # parsed records kept per log (a few KB each)
_STATE_CACHE = 8


class VersionLog:
    """Reads and appends the log of one dataset through a storage backend."""

    def __init__(self, backend: Backend, dataset: str,
                 checkpoint_interval: int = DEFAULT_CHECKPOINT_INTERVAL) -> None:
        self.backend = backend
        self.dataset = dataset
        self.checkpoint_interval = checkpoint_interval
        self._entries: OrderedDict[int, LogEntry] = OrderedDict()
        self._states: OrderedDict[int, LogState] = OrderedDict()
        self._head_floor = 0  # records are never removed, so the head only grows

    # ---- names --------------------------------------------------------------------
    def record_rel(self, version: int) -> str:
        """Path of a version's record, relative to the store root."""
        return f"{self.dataset}/{VERSIONS_DIR}/{version:020d}.json"

    def checkpoint_rel(self, version: int) -> str:
        """Path of a version's checkpoint."""
        return f"{self.dataset}/{CHECKPOINTS_DIR}/{version:020d}.json"

    def key_rel(self, key: str) -> str:
        """Path of the marker of an idempotency key (hashed: keys are free-form text)."""
        digest = hashlib.sha256(key.encode()).hexdigest()
        return f"{self.dataset}/{KEYS_DIR}/{digest[:2]}/{digest[2:40]}.json"

    # ---- records ------------------------------------------------------------------
    def versions(self) -> list[int]:
        """Every version that has a record, ascending (lists the folder: O(versions))."""
        found = (RECORD_NAME.fullmatch(n) for n in
                 self.backend.list(f"{self.dataset}/{VERSIONS_DIR}"))
        return sorted(int(m.group(1)) for m in found if m)

    def exists(self, version: int) -> bool:
        """Whether version `version` is committed."""
        return version in self._entries or self.backend.exists(self.record_rel(version))

    def head_version(self) -> int | None:
        """The newest committed version, found with O(log N) existence checks.

        Versions are contiguous (each commit creates parent + 1), so the head is found by
        galloping up from the newest checkpoint, then bisecting.
        """
        start = max(self._head_floor, self._hinted_checkpoint() or 0)
        if not self.exists(start):
            numbers = self.versions()  # damaged or empty: what the folder holds
            return numbers[-1] if numbers else None
        low, step = start, 1
        while self.exists(low + step):
            low += step
            step *= 2
        high = low + step  # low exists, high does not
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if self.exists(mid) else (low, mid)
        self._head_floor = low
        return low

    def read_text(self, version: int) -> str:
        """A record's text; FileNotFoundError if the version does not exist."""
        raw = self.backend.read_bytes(self.record_rel(version))
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CorruptionError(f"version record {self.record_rel(version)} is not UTF-8 "
                                  f"text (byte {exc.start}); run `dyngen verify`.") from None

    def entry(self, version: int, *, cache: bool = True) -> LogEntry:
        """The parsed record of a version (cached unless streaming: records never change)."""
        cached = self._entries.get(version)
        if cached is not None:
            self._entries.move_to_end(version)
            return cached
        origin = self.backend.describe(self.record_rel(version))
        entry = LogEntry.from_json(self.read_text(version), origin)
        if entry.version != version or entry.dataset != self.dataset:
            raise CorruptionError(
                f"version record {origin} says it is version {entry.version} of "
                f"{entry.dataset!r}; expected version {version} of {self.dataset!r}."
            )
        if cache:
            self.remember(entry)
        return entry

    def remember(self, entry: LogEntry) -> None:
        """Cache a record this process just read or committed."""
        _keep(self._entries, entry.version, entry, _ENTRY_CACHE)
        self._head_floor = max(self._head_floor, entry.version)

    # ---- states -------------------------------------------------------------------
    def state(self, version: int) -> LogState:
        """The full state of a version: a checkpoint (or a cached state) plus replay.

        A restore sets the shards, but the running state (retention, generators) comes
        from its parent like any record's, so replay goes on through it. Only over damage
        does a restore start afresh: a record that cannot be read or applied leaves the
        state unknown until the next restore, which states its shards in full.
        """
        cached = self._states.get(version)
        if cached is not None:
            self._states.move_to_end(version)
            return cached
        base = self._states.get(version - 1)
        chain: list[LogEntry] = []
        damage: Exception | None = None
        if base is None:
            checkpoint = self.newest_checkpoint(version)
            stop = checkpoint.version if checkpoint is not None else -1
            base = checkpoint
            k = version
            while k > stop:
                if k in self._states:
                    base = self._states[k]
                    break
                try:
                    entry = self.entry(k)
                except (CorruptionError, OSError) as exc:
                    if not any(_self_contained(e) for e in chain):
                        raise
                    base, damage = None, exc
                    break
                chain.append(entry)
                k -= 1
        else:
            chain.append(self.entry(version))
        state, known = base, damage is None
        for entry in reversed(chain):
            if not known and not _self_contained(entry):
                continue  # after damage, nothing is known until a restore
            try:
                state, known = apply(state if known else None, entry), True
            except CorruptionError as exc:
                known, damage = False, exc
        if not known:
            assert damage is not None
            raise damage
        assert state is not None
        self.keep_state(state)
        return state

    def keep_state(self, state: LogState) -> None:
        """Cache a state (the newest few: the next version's is one record away)."""
        _keep(self._states, state.version, state, _STATE_CACHE)

    def replay(self, start: int, stop: int) -> Iterator[tuple[LogEntry, LogState]]:
        """Each version from `start` to `stop` inclusive with its state, in bounded memory."""
        state = self.state(start - 1) if start > 0 else None
        for version in range(start, stop + 1):
            entry = self.entry(version, cache=False)
            state = apply(state, entry)
            yield entry, state

    # ---- checkpoints ----------------------------------------------------------------
    def checkpoint_versions(self) -> list[int]:
        """Versions that have a checkpoint file, ascending."""
        found = (RECORD_NAME.fullmatch(n) for n in
                 self.backend.list(f"{self.dataset}/{CHECKPOINTS_DIR}"))
        return sorted(int(m.group(1)) for m in found if m)

    def read_checkpoint(self, version: int) -> LogState:
        """A checkpoint, checked; CorruptionError if damaged, FileNotFoundError if absent."""
        rel = self.checkpoint_rel(version)
        try:
            text = self.backend.read_bytes(rel).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CorruptionError(f"checkpoint {rel} is not UTF-8 text (byte {exc.start})"
                                  ) from None
        state = LogState.from_json(text, rel)
        if (state.dataset, state.version) != (self.dataset, version):
            raise CorruptionError(f"checkpoint {rel} says it is version {state.version} of "
                                  f"{state.dataset!r}")
        return state

    def newest_checkpoint(self, at_most: int) -> LogState | None:
        """The newest readable checkpoint at or below `at_most` (None: replay from 0)."""
        hinted = self._hinted_checkpoint()
        if hinted is not None and hinted <= at_most:
            try:
                return self.read_checkpoint(hinted)
            except (OSError, CorruptionError):
                pass  # a damaged or missing checkpoint: an older one, or replay, will do
        for version in reversed(self.checkpoint_versions()):
            if version <= at_most and version != hinted:
                try:
                    return self.read_checkpoint(version)
                except (OSError, CorruptionError):
                    continue
        return None

    def _hinted_checkpoint(self) -> int | None:
        try:
            data = json.loads(self.backend.read_bytes(
                f"{self.dataset}/{CHECKPOINTS_DIR}/{HINT_NAME}"))
        except (OSError, ValueError):
            return None
        version = data.get("version") if isinstance(data, dict) else None
        return version if isinstance(version, int) and version >= 0 else None

    def write_checkpoint(self, state: LogState) -> None:
        """Write the checkpoint of `state`, then point the hint at it if it is newer."""
        # Another writer may have checkpointed this version already: the same state.
        with contextlib.suppress(FileExistsError):
            self.backend.write_new(self.checkpoint_rel(state.version), state.to_json().encode(),
                                   hook=_checkpoint_stage)
        hinted = self._hinted_checkpoint()
        if hinted is None or hinted < state.version:
            self.backend.replace(f"{self.dataset}/{CHECKPOINTS_DIR}/{HINT_NAME}",
                                 json.dumps({"version": state.version}).encode())

    def wants_checkpoint(self, entry: LogEntry, parent: LogEntry | None) -> bool:
        """Every K versions, and at once after a log of format 1 gets its first new record."""
        upgraded = parent is not None and parent.format == 1
        return upgraded or (entry.version > 0 and entry.version % self.checkpoint_interval == 0)

    # ---- idempotency markers ---------------------------------------------------------
    def marked_version(self, key: str) -> int | None:
        """The version a key's marker names; None if there is no usable marker."""
        try:
            data = json.loads(self.backend.read_bytes(self.key_rel(key)))
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return None  # a damaged marker: the caller falls back to reading the log
        if not isinstance(data, dict) or data.get("key") != key:
            return None
        version = data.get("version")
        return version if isinstance(version, int) and not isinstance(version, bool) else None

    def mark_key(self, key: str, version: int) -> None:
        """Create the marker of a committed version's idempotency key (kept if it exists)."""
        rel = self.key_rel(key)
        if self.backend.exists(rel):
            return
        body = json.dumps({"key": key, "version": version}, ensure_ascii=False)
        if self.backend.create_exclusive(rel, body.encode()):
            crash_point("store.after_key_marker")

    def marker_unusable(self, key: str) -> bool:
        """Whether a key's marker exists but cannot be trusted (damaged or for another key)."""
        return self.backend.exists(self.key_rel(key)) and self.marked_version(key) is None

    def scan_for_key(self, key: str, below: int, stop: int = 0) -> LogEntry | None:
        """The newest record in [stop, below) with `key`, reading the log itself.

        Only records whose text names the key (or that are not whole) are parsed.
        """
        needles = (f'"idempotency_key": {json.dumps(key)}',
                   f'"idempotency_key":{json.dumps(key, ensure_ascii=False)}')
        for version in range(below - 1, stop - 1, -1):
            if version not in self._entries:
                try:
                    text = self.read_text(version)
                except (OSError, CorruptionError):
                    text = ""  # entry() below says what is wrong
                if not any(n in text for n in needles) and text.endswith("}\n"):
                    continue
            entry = self.entry(version)
            if entry.idempotency_key == key:
                return entry
        return None


def _self_contained(entry: LogEntry) -> bool:
    """Whether a record states its whole shard lists (a restore), so it reads over damage."""
    return entry.snapshot is not None and entry.snapshot.quarantine is not None


def _keep(cache: OrderedDict[int, Any], key: int, value: Any, limit: int) -> None:
    """Put `value` in a least-recently-used cache of at most `limit` entries."""
    cache[key] = value
    cache.move_to_end(key)
    if len(cache) > limit:
        cache.popitem(last=False)


def _checkpoint_stage(stage: str) -> None:
    """Crash points of a checkpoint write: before and after its name exists."""
    if stage == "written":
        crash_point("store.checkpoint_before_link")
    else:
        crash_point("store.checkpoint_after_link")
