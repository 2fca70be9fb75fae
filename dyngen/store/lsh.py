"""A shard's LSH sidecar: its rows' MinHash band keys, sorted, memory-mapped for lookups.

Layout (little-endian), ~196 bytes per row at 16 bands:

    b"DYNLSH1\\n"  uint32 header length  JSON header (padded to 8 bytes)
    uint64[E] band keys, sorted    uint32[E] the row (within the shard) of each key
    uint32[R] a hash of each row's number literals

The header says how the keys were made (library and version, algorithm, seed, num_perm,
bands, shingling: `LshParams.header()`) and how many rows and keys follow. A sidecar whose
header differs from what a round would compute is never compared (`check_header`).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dyngen.errors import CorruptionError, StoreError
from dyngen.store.minhash import LshParams

MAGIC = b"DYNLSH1\n"
_KEY = np.dtype("<u8")
_ROW = np.dtype("<u4")


class IndexMismatchError(StoreError):
    """A near-duplicate sidecar was built otherwise than the round's settings ask."""


def encode(eligible: np.ndarray, keys: np.ndarray, number_hashes: np.ndarray,
           params: LshParams) -> bytes:
    """The sidecar of a shard's rows, in order: which have words, their band keys (rows,
    bands) and number hashes (see `minhash.hash_prompts`)."""
    rows = np.flatnonzero(eligible).astype(_ROW)
    return _pack(params.header(), keys[eligible].reshape(-1), np.repeat(rows, params.bands),
                 number_hashes.astype(_ROW), len(eligible))


def _pack(header: dict[str, Any], keys: np.ndarray, rows: np.ndarray,
          number_hashes: np.ndarray, n_rows: int) -> bytes:
    order = np.argsort(keys, kind="stable")
    head = json.dumps({**header, "rows": n_rows, "entries": len(keys)},
                      sort_keys=True).encode()
    head += b" " * (-(len(MAGIC) + 4 + len(head)) % 8)
    return b"".join([MAGIC, struct.pack("<I", len(head)), head,
                     keys[order].astype(_KEY).tobytes(), rows[order].astype(_ROW).tobytes(),
                     number_hashes.astype(_ROW).tobytes()])


@dataclass(frozen=True)
class Sidecar:
    """One sidecar, memory-mapped: its header, sorted keys, their rows, number hashes."""

    header: dict[str, Any]
    keys: np.ndarray
    rows: np.ndarray
    number_hashes: np.ndarray

    def lookup(self, queries: Queries) -> tuple[np.ndarray, np.ndarray]:
        """(query, row) pairs whose band key matches and whose numbers' hash agrees; a pair
        appears once per band it matches in."""
        if not len(self.keys) or not len(queries.keys):
            return np.empty(0, np.int64), np.empty(0, np.int64)
        # Sorted needles walk the memory-mapped keys in one direction: few pages, each once.
        left = np.searchsorted(self.keys, queries.keys, "left")
        hit = np.flatnonzero(self.keys[np.minimum(left, len(self.keys) - 1)] == queries.keys)
        if not len(hit):
            return np.empty(0, np.int64), np.empty(0, np.int64)
        reps = np.searchsorted(self.keys, queries.keys[hit], "right") - left[hit]
        # Every stored entry in [left, right) of each hit: offsets within each run.
        starts = np.repeat(left[hit], reps)
        within = np.arange(reps.sum()) - np.repeat(np.cumsum(reps) - reps, reps)
        rows = self.rows[starts + within].astype(np.int64)
        ids = np.repeat(queries.ids[hit], reps)
        same = self.number_hashes[rows] == queries.number_hashes[ids]
        return ids[same], rows[same]


@dataclass(frozen=True)
class Queries:
    """New rows' band keys, sorted once for every shard's lookup."""

    keys: np.ndarray  # every band key of every query, sorted
    ids: np.ndarray  # the query each key belongs to
    number_hashes: np.ndarray  # per query

    @classmethod
    def of(cls, keys: np.ndarray, number_hashes: np.ndarray) -> Queries:
        """From (queries, bands) keys and one number hash per query."""
        flat = keys.reshape(-1)
        order = np.argsort(flat, kind="stable")
        return cls(flat[order], order // keys.shape[1], np.asarray(number_hashes))


def read(path: Path) -> Sidecar:
    """Memory-map a sidecar; CorruptionError if it is not one or is cut short."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        start = fh.read(len(MAGIC) + 4)
        if len(start) < len(MAGIC) + 4 or start[: len(MAGIC)] != MAGIC:
            raise CorruptionError(f"{path.name} is not a dyngen LSH sidecar (bad magic)")
        (head_len,) = struct.unpack("<I", start[len(MAGIC):])
        try:
            header = json.loads(fh.read(head_len))
            entries, n_rows = int(header["entries"]), int(header["rows"])
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptionError(f"{path.name}: unreadable header ({exc})") from exc
    offset = len(MAGIC) + 4 + head_len
    expected = offset + entries * (_KEY.itemsize + _ROW.itemsize) + n_rows * _ROW.itemsize
    if size != expected:
        raise CorruptionError(f"{path.name} holds {size} bytes, its header implies {expected}")
    if size == offset:
        empty = np.empty(0, _KEY)
        return Sidecar(header, empty, empty.astype(_ROW), empty.astype(_ROW))
    data = np.memmap(path, dtype=np.uint8, mode="r")
    keys = data[offset: offset + entries * 8].view(_KEY)
    rows_at = offset + entries * 8
    rows = data[rows_at: rows_at + entries * 4].view(_ROW)
    return Sidecar(header, keys, rows, data[rows_at + entries * 4:].view(_ROW))


def check_header(header: dict[str, Any], params: LshParams, where: str) -> None:
    """Refuse a sidecar built otherwise than `params` ask, naming the differences."""
    wanted = params.header()
    diff = {k: (header.get(k), v) for k, v in wanted.items() if header.get(k) != v}
    if diff:
        said = "; ".join(f"{k}: sidecar {old!r}, now {new!r}" for k, (old, new) in diff.items())
        raise IndexMismatchError(
            f"the near-duplicate index of {where} was built with other settings ({said}); "
            "hashes made otherwise are never compared. Rebuild it with `dyngen "
            "rebuild-index NAME` (with the same config), or set round.near_duplicate back to "
            "the settings it was built with.")


def merge(parts: list[Sidecar]) -> bytes:
    """One sidecar for shards concatenated in order (their headers must agree)."""
    header = {k: v for k, v in parts[0].header.items() if k not in ("rows", "entries")}
    keys, rows, hashes, offset = [], [], [], 0
    for part in parts:
        if {k: v for k, v in part.header.items() if k not in ("rows", "entries")} != header:
            raise ValueError("sidecars built with different settings cannot be merged")
        keys.append(np.asarray(part.keys))
        rows.append(np.asarray(part.rows, dtype=np.int64) + offset)
        hashes.append(np.asarray(part.number_hashes))
        offset += int(part.header["rows"])
    if offset >= 2**32:
        raise ValueError("a shard of 2**32 rows or more cannot be indexed")
    return _pack(header, np.concatenate(keys), np.concatenate(rows).astype(_ROW),
                 np.concatenate(hashes), offset)
