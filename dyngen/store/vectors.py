"""A shard's semantic sidecar: its rows' embeddings as a faiss index of int8 vectors, and a
hash of each row's numbers, memory-mapped for lookups.

Layout: a faiss index file first, so faiss memory-maps it from the sidecar's own path
(`IO_FLAG_MMAP`: a round reads only the lists it probes), then dyngen's part:

    faiss index (IVF over a flat quantizer, vectors int8 by faiss's scalar quantizer)
    JSON header    uint32[R] a hash of each row's number literals, in order
    uint64 offset of the header    uint32 header length    b"DYNVEC1\\n"

The header says what made the vectors (model, its wheel's version or the endpoint's
model, dims, quantization, metric, how a prompt becomes text and numbers a key: the
`wanted` header) and how many rows follow. A sidecar whose header differs from what the
round would embed is never compared (`check_header`).

Why faiss (IVF, int8): a shard's index trains and fills in seconds on 2 cores, so
compaction rebuilds merged shards cheaply, and a query reads only the few lists it probes;
usearch's HNSW graph took ~100 s per 100k rows to build here and ~530 bytes a row at the
recall we need (benchmarks/semantic_dup.py and docs/concepts/filters.md have the numbers).
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from dyngen.errors import CorruptionError
from dyngen.store.lsh import IndexMismatchError
from dyngen.store.minhash import number_hash, numbers

MAGIC = b"DYNVEC1\n"
_FOOT = struct.Struct("<QI")
_HASH = np.dtype("<u4")
SMALLEST = 64  # fewer rows: every row scanned (no lists)
MAX_LISTS = 1024  # training cost grows with lists squared
NPROBE = 8  # lists read per query and shard
TRAIN_PER_LIST = 40  # faiss asks for at least 39 points per centroid
RULES = {
    "format": 1,
    "text": "the content of the non-system messages, joined by newlines",
    "numbers": "crc32 of the number literals in order, as written (minhash.number_hash)",
    "quantization": "int8 (faiss QT_8bit_uniform over the shard's largest component)",
    "metric": "cosine (inner product of unit vectors)",
}
_UNCOMPARED = ("rows", "lists", "faiss_version")  # differ from shard to shard, not vectors


def number_key(text: str) -> int:
    """A 32-bit hash of a text's number literals in order: the MinHash sidecar's hash."""
    return number_hash(numbers(text))


def wanted_header(model_header: dict[str, Any]) -> dict[str, Any]:
    """The header a sidecar of an embedder's vectors must carry to be compared."""
    return {**RULES, **model_header}


def digest(header: dict[str, Any]) -> str:
    """A short name of what made a sidecar's vectors: sidecars made alike share it."""
    text = json.dumps({k: v for k, v in header.items() if k not in _UNCOMPARED},
                      sort_keys=True)
    return f"{zlib.crc32(text.encode()):08x}"


def encode(vectors: np.ndarray, number_keys: np.ndarray, header: dict[str, Any]) -> bytes:
    """The sidecar of a shard's rows, in order: unit vectors (rows, dims), number keys."""
    import faiss

    n = len(vectors)
    lists = 0
    blob = b""
    if n:
        vectors = np.ascontiguousarray(vectors, np.float32)
        lists = n_lists(n)
        index = _new_index(vectors.shape[1], lists)
        # An evenly spaced sample: the same rows make the same sidecar.
        step = max(1, n // max(1, lists * TRAIN_PER_LIST))
        index.train(vectors[::step])
        # One int8 range for every dimension, the shard's largest component: no row is
        # clipped, and a small shard's few rows cannot make a narrow range.
        top = max(float(np.abs(vectors).max()), 1e-6)
        faiss.copy_array_to_vector(np.array([-top, 2 * top], np.float32), index.sq.trained)
        index.add(vectors)
        blob = faiss.serialize_index(index).tobytes()
    head = json.dumps({**header, "rows": n, "lists": lists,
                       "faiss_version": faiss_version()}, sort_keys=True).encode()
    return b"".join([blob, head, np.asarray(number_keys, _HASH).tobytes(),
                     _FOOT.pack(len(blob), len(head)), MAGIC])


def n_lists(rows: int) -> int:
    """Inverted lists for a shard of `rows`: a query compares every centroid, then reads
    NPROBE lists, so sqrt(NPROBE * rows) lists cost it least (a round shard of 1,000 rows:
    89 lists, 180 vectors read instead of 1,000); at most MAX_LISTS (training cost)."""
    return min(MAX_LISTS, math.isqrt(NPROBE * rows)) if rows >= SMALLEST else 0


def _new_index(dims: int, lists: int) -> Any:
    import faiss

    kind = faiss.ScalarQuantizer.QT_8bit_uniform
    if lists < 2:  # a tiny shard: every row scanned (k-means needs rows to cluster)
        return faiss.IndexScalarQuantizer(dims, kind, faiss.METRIC_INNER_PRODUCT)
    index = faiss.IndexIVFScalarQuantizer(faiss.IndexFlatIP(dims), dims, lists, kind,
                                          faiss.METRIC_INNER_PRODUCT)
    index.cp.min_points_per_centroid = 5  # small shards: few rows a list, by design
    return index


@dataclass
class VecSidecar:
    """One sidecar: its header, its rows' number keys, and its faiss index (mapped)."""

    header: dict[str, Any]
    number_keys: np.ndarray
    path: Path
    _index: Any = field(default=None, repr=False)

    @property
    def rows(self) -> int:
        return int(self.header["rows"])

    def index(self) -> Any:
        """The faiss index, memory-mapped from the sidecar (read on first use)."""
        if self._index is None:
            import faiss

            self._index = faiss.read_index(str(self.path), faiss.IO_FLAG_MMAP)
            if hasattr(self._index, "nprobe"):
                self._index.nprobe = NPROBE
        return self._index

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The `k` most similar rows of each query (cosines, rows); row -1 where fewer."""
        if not self.rows or not len(queries):
            return (np.full((len(queries), k), -1.0, np.float32),
                    np.full((len(queries), k), -1, np.int64))
        return self.index().search(np.ascontiguousarray(queries, np.float32), k)

    def vectors(self) -> np.ndarray:
        """Every row's vector, decoded from int8 (what compaction merges)."""
        if not self.rows:
            return np.zeros((0, int(self.header["dims"])), np.float32)
        index = self.index()
        if hasattr(index, "make_direct_map"):
            index.make_direct_map()
        return index.reconstruct_n(0, self.rows)


def read(path: Path) -> VecSidecar:
    """A sidecar's header and number keys; CorruptionError if it is not one or is cut."""
    size = path.stat().st_size
    foot = len(MAGIC) + _FOOT.size
    with open(path, "rb") as fh:
        if size < foot:
            raise CorruptionError(f"{path.name} is not a dyngen semantic sidecar (too short)")
        fh.seek(size - foot)
        tail = fh.read(foot)
        if tail[_FOOT.size:] != MAGIC:
            raise CorruptionError(f"{path.name} is not a dyngen semantic sidecar (bad magic)")
        at, head_len = _FOOT.unpack(tail[:_FOOT.size])
        fh.seek(at)
        try:
            header = json.loads(fh.read(head_len))
            rows = int(header["rows"])
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptionError(f"{path.name}: unreadable header ({exc})") from exc
    expected = at + head_len + rows * _HASH.itemsize + foot
    if size != expected:
        raise CorruptionError(f"{path.name} holds {size} bytes, its header implies {expected}")
    keys = np.fromfile(path, _HASH, count=rows, offset=at + head_len) if rows \
        else np.empty(0, _HASH)
    return VecSidecar(header, keys, path)


def check_header(header: dict[str, Any], wanted: dict[str, Any], where: str) -> None:
    """Refuse a sidecar made otherwise than `wanted`, naming the differences."""
    diff = {k: (header.get(k), v) for k, v in wanted.items()
            if k not in _UNCOMPARED and header.get(k) != v}
    if diff:
        said = "; ".join(f"{k}: sidecar {old!r}, now {new!r}" for k, (old, new) in diff.items())
        raise IndexMismatchError(
            f"the semantic index of {where} was made otherwise ({said}); vectors made "
            "otherwise are never compared. Rebuild it with `dyngen rebuild-index NAME` (with "
            "the same config), or set round.semantic_duplicate back to what made it.")


def merge(parts: list[VecSidecar]) -> bytes:
    """One sidecar for shards concatenated in order (made alike): a new index of their
    decoded vectors."""
    header = {k: v for k, v in parts[0].header.items() if k not in _UNCOMPARED}
    if any(digest(p.header) != digest(header) for p in parts):
        raise ValueError("semantic sidecars made otherwise cannot be merged")
    vectors = np.concatenate([p.vectors() for p in parts])
    return encode(vectors, np.concatenate([np.asarray(p.number_keys) for p in parts]), header)


def encode_to(path: Path, vectors: np.ndarray, number_keys: np.ndarray,
              header: dict[str, Any]) -> VecSidecar:
    """Write a sidecar to `path` and read it back (the benchmark's and the tests' way)."""
    path.write_bytes(encode(vectors, number_keys, header))
    return read(path)


@lru_cache(maxsize=1)
def faiss_version() -> str:
    """The installed faiss (recorded; vectors do not depend on it)."""
    import faiss

    return str(faiss.__version__)
