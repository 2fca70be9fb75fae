"""Batch-end keys and the covered set: which (training run, step) entries versions cover.

A batch end in a dataset's inbox (dyngen/store/inbox.py) is keyed by its training run id
and step. A version record names the keys it covers (its `covers`); the covered set of
version N is the union of those of versions 0..N, and only grows. Each state carries it
(so each checkpoint does) in an exact, compact form: per run, its covered steps as
arithmetic progressions (start, stride, count), in order. A run whose every step (or
every k-th step) was covered is one progression however long it trains, so a checkpoint
stays small over 100,000 rounds; only a late step (covered after a later one) splits one.

The errors of the inbox and of covering are dyngen.errors' BatchEndError and CoverageError.
"""

from __future__ import annotations

import numbers
import string
import unicodedata
import urllib.parse
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from dyngen.errors import (
    AlreadyCoveredError,
    BatchEndError,
    CoverageError,
    CoverageOrderError,
    NotInInboxError,
    describe_batch_end,
)

Key = tuple[str, int]  # (training run id, step)
Progression = tuple[int, int, int]  # (first step, stride, count): stride 1 when count is 1
MAX_STEP = 10**18 - 1  # written as 20 digits; far beyond any training run
MAX_RUN_BYTES = 200  # a run id once encoded: one file name, with room for the store's own
_SAFE = frozenset(string.ascii_letters + string.digits + "_-.")
__all__ = ["AlreadyCoveredError", "BatchEndError", "CoverageError", "CoverageOrderError",
           "Covered", "Key", "NotInInboxError"]


describe = describe_batch_end  # a key for messages: `run 'a' step 3`


# ---- validation --------------------------------------------------------------------
def check_run(run: object) -> str:
    """`run` if it is a usable training run id, else BatchEndError saying why."""
    if not isinstance(run, str):
        raise BatchEndError(f"training run id: expected a non-empty string (a TRL run name, a "
                            f"verl experiment name, …), found {type(run).__name__}. Pass the "
                            "run's name as text.")
    if not run.strip():
        raise BatchEndError(f"training run id: expected a non-empty string, found {run!r}. "
                            "Name the run (e.g. the trainer's experiment name).")
    for at, ch in enumerate(run):
        if unicodedata.category(ch) in ("Cc", "Cs"):
            raise BatchEndError(
                f"training run id {run[:80]!r}: expected printable text, found the control "
                f"character U+{ord(ch):04X} at position {at}. Remove it from the run's name.")
    size = len(encode_run(run))
    if size > MAX_RUN_BYTES:
        raise BatchEndError(
            f"training run id {run[:80]!r}…: expected at most {MAX_RUN_BYTES} bytes once "
            f"encoded for a file name (letters, digits, '_', '-', '.' count one, any other "
            f"character three per UTF-8 byte), found {size}. Use a shorter run name.")
    return run


def check_step(step: object) -> int:
    """`step` as an int if it is a usable training step, else BatchEndError."""
    if isinstance(step, bool) or not isinstance(step, numbers.Integral):
        raise BatchEndError(f"training step: expected an integer >= 0, found "
                            f"{type(step).__name__} ({str(step)[:40]}). Pass the trainer's "
                            "global step as an int.")
    value = int(step)
    if not 0 <= value <= MAX_STEP:
        raise BatchEndError(f"training step: expected an integer from 0 to {MAX_STEP}, found "
                            f"{str(value)[:40]}{'…' if len(str(value)) > 40 else ''}. Pass "
                            "the trainer's global step.")
    return value


def entry_keys(items: Iterable[Any]) -> tuple[Key, ...]:
    """Keys from BatchEnd objects or (run, step) pairs: checked, unique, sorted."""
    if isinstance(items, (str, bytes, Mapping)):
        raise BatchEndError(f"covers: expected a list of batch ends or (run, step) pairs, "
                            f"found {type(items).__name__}. Pass Store.pending(...)'s list.")
    keys = set()
    for at, item in enumerate(items):
        key = getattr(item, "key", item)
        if not isinstance(key, (tuple, list)) or len(key) != 2:
            raise BatchEndError(f"covers[{at}]: expected a BatchEnd or a (run, step) pair, "
                                f"found {type(item).__name__}. Pass Store.pending(...)'s list.")
        keys.add((check_run(key[0]), check_step(key[1])))
    return tuple(sorted(keys))


def parse_covers(value: Any) -> tuple[Key, ...]:
    """A record's `covers` (a list of [run, step]); TypeError or ValueError if malformed."""
    if not isinstance(value, list):
        raise TypeError(f"field 'covers' must be list, found {type(value).__name__}")
    out = []
    for item in value:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)
                and type(item[1]) is int and item[1] >= 0):
            raise TypeError("field 'covers' must hold [run, step] pairs (text, integer >= 0)")
        out.append((item[0], item[1]))
    return tuple(out)


# ---- run ids as file names -----------------------------------------------------------
def encode_run(run: str) -> str:
    """A run id as one file name: letters, digits, '_', '-' and '.' (not first) kept, every
    other character as %XX of its UTF-8 bytes. Never '.', '..', nor a hidden name."""
    out = []
    for at, ch in enumerate(run):
        if ch in _SAFE and not (at == 0 and ch == "."):
            out.append(ch)
        else:
            out.extend(f"%{b:02X}" for b in ch.encode("utf-8"))
    return "".join(out)


def decode_run(name: str) -> str | None:
    """The run id a folder name encodes; None if it is not the encoding of one."""
    try:
        run = urllib.parse.unquote(name, errors="strict")
    except UnicodeDecodeError:
        return None
    return run if run and encode_run(run) == name else None


# ---- the covered set ------------------------------------------------------------------
@dataclass(frozen=True)
class Covered:
    """The batch ends covered up to a version: per run, progressions of steps, in order."""

    runs: Mapping[str, tuple[Progression, ...]] = field(default_factory=dict)

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, tuple) or len(key) != 2:
            return False
        run, step = key
        progressions = self.runs.get(run)
        if not progressions:
            return False
        at = bisect_right(progressions, step, key=lambda p: p[0]) - 1
        if at < 0:
            return False
        start, stride, count = progressions[at]
        offset = step - start
        return offset % stride == 0 and offset // stride < count

    def __len__(self) -> int:
        return sum(p[2] for progressions in self.runs.values() for p in progressions)

    def steps(self, run: str) -> list[int]:
        """The covered steps of `run`, ascending."""
        return [s for p in self.runs.get(run, ()) for s in _expand(p)]

    def keys(self) -> Iterator[Key]:
        """Every covered key, by run then step."""
        for run in sorted(self.runs):
            for step in self.steps(run):
                yield run, step

    def last(self, run: str) -> int | None:
        """The newest covered step of `run` (None: none covered)."""
        progressions = self.runs.get(run)
        return _end(progressions[-1]) if progressions else None

    def with_keys(self, keys: Iterable[Key]) -> Covered:
        """This set and `keys` (O(runs) in the common case: new steps after covered ones)."""
        by_run: dict[str, set[int]] = {}
        for run, step in keys:
            by_run.setdefault(run, set()).add(step)
        if not by_run:
            return self
        runs = dict(self.runs)
        for run, steps in by_run.items():
            runs[run] = _added(runs.get(run, ()), sorted(steps))
        return Covered(runs)

    def to_json(self) -> dict[str, list[list[int]]]:
        """The checkpoint form: {run: [[start, stride, count], ...]}, runs sorted."""
        return {run: [list(p) for p in self.runs[run]] for run in sorted(self.runs)}

    @classmethod
    def from_json(cls, data: Any) -> Covered:
        """Parse the checkpoint form, checking it; TypeError or ValueError if malformed."""
        if not isinstance(data, dict):
            raise TypeError(f"covered must be an object, found {type(data).__name__}")
        runs = {}
        for run, items in data.items():
            if not isinstance(items, list) or not items:
                raise TypeError(f"covered steps of a run must be a non-empty list, found "
                                f"{type(items).__name__}")
            end = -1
            progressions = []
            for item in items:
                if not (isinstance(item, list) and len(item) == 3
                        and all(type(v) is int for v in item)):
                    raise TypeError("covered steps must be [start, stride, count] integers")
                start, stride, count = item
                if start <= end or stride < 1 or count < 1:
                    raise ValueError("covered steps must be ascending progressions")
                progressions.append((start, stride, count))
                end = _end(progressions[-1])
            runs[run] = tuple(progressions)
        return cls(runs)


EMPTY = Covered()


def _end(progression: Progression) -> int:
    start, stride, count = progression
    return start + stride * (count - 1)


def _expand(progression: Progression) -> range:
    start, stride, count = progression
    return range(start, start + stride * count, stride)


def _added(progressions: tuple[Progression, ...], steps: list[int]) -> tuple[Progression, ...]:
    """`progressions` with `steps` (ascending, unique) in canonical form: the greedy encoding
    of the ascending steps, so equal sets are equal values whatever the order of commits."""
    out = list(progressions)
    if out and steps[0] <= _end(out[-1]):  # a late step: encode the run again (rare)
        merged = sorted({s for p in out for s in _expand(p)} | set(steps))
        out, steps = [], merged
    for step in steps:
        if out:
            start, stride, count = out[-1]
            if count == 1:
                out[-1] = (start, step - start, 2)
                continue
            if step - _end(out[-1]) == stride:
                out[-1] = (start, stride, count + 1)
                continue
        out.append((step, 1, 1))
    return tuple(out)
