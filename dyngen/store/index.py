"""A version's per-shard indexes: its shards' sidecars, found, built, merged.

Two kinds of sidecar follow a shard (`Kind`): MinHash LSH band keys (`ShardInfo.lsh`,
dyngen/store/lsh.py) and semantic vectors (`ShardInfo.vec`, dyngen/store/vectors.py).
A shard's own sidecar is written before the record that names it, like its prompt keys.
A shard without one (a store older than the detection, or written with it off) gets a
derived sidecar, `_index/<shard sha256>-<settings>.<kind>`: a shard never changes, so
neither does its derived sidecar, and any version naming the shard may use it.
`rebuild_index` writes derived sidecars for shards whose own were made with other
settings; nothing else ever compares hashes or vectors made otherwise.
"""

from __future__ import annotations

import contextlib
import json
import zlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dyngen.errors import CorruptionError
from dyngen.faults import crash_point
from dyngen.progress import QUIET, Bar
from dyngen.store import lsh
from dyngen.store.minhash import LshParams, hash_prompts
from dyngen.store.records import ShardInfo

if TYPE_CHECKING:
    from dyngen.store.reader import StoreReader

INDEX_DIR = "_index"
CHUNK_ROWS = 20_000  # a progress step every second or so


class Kind(ABC):
    """One kind of sidecar: where a shard names it, how it is read, made, checked, merged.

    Reading and merging need no settings; `digest`, `check` and `build` are those of the
    settings the kind was made with (what a round would compute)."""

    field = "lsh"  # the ShardInfo attribute naming a shard's own sidecar
    suffix = ".lsh"
    label = "near-duplicate"

    @abstractmethod
    def read(self, path: Path) -> Any:
        """A sidecar file, mapped; CorruptionError if it is not one."""

    @abstractmethod
    def header_digest(self, header: dict[str, Any]) -> str:
        """A short name of what made a sidecar (from its header)."""

    @abstractmethod
    def digest(self) -> str:
        """A short name of what these settings make."""

    @abstractmethod
    def check(self, header: dict[str, Any], where: str) -> None:
        """IndexMismatchError, naming the differences, if a sidecar was made otherwise."""

    @abstractmethod
    def build(self, prompts: Sequence[Any], progress: Bar = QUIET) -> bytes:
        """The sidecar of a shard holding `prompts`, in order."""

    @abstractmethod
    def merge(self, parts: list[Any]) -> bytes:
        """One sidecar for shards concatenated in order."""


@dataclass(frozen=True)
class LshKind(Kind):
    """MinHash LSH band keys, hashed as `params` say."""

    params: LshParams = LshParams()

    def read(self, path: Path) -> lsh.Sidecar:
        return lsh.read(path)

    def header_digest(self, header: dict[str, Any]) -> str:
        return settings_digest(header)

    def digest(self) -> str:
        return self.params.digest()

    def check(self, header: dict[str, Any], where: str) -> None:
        lsh.check_header(header, self.params, where)

    def build(self, prompts: Sequence[Any], progress: Bar = QUIET) -> bytes:
        return sidecar_bytes(prompts, self.params, progress)

    def merge(self, parts: list[Any]) -> bytes:
        return lsh.merge(parts)


LSH = LshKind()


def as_kind(settings: LshParams | Kind) -> Kind:
    """The kind of sidecar `settings` make (MinHash settings: an LSH sidecar)."""
    return LshKind(settings) if isinstance(settings, LshParams) else settings


def sidecar_bytes(prompts: Sequence[Any], params: LshParams, progress: Bar = QUIET) -> bytes:
    """The sidecar of a shard holding `prompts`, in order (hashed in chunks)."""
    eligible, keys, numbers = [], [], []
    for start in range(0, len(prompts), CHUNK_ROWS):
        chunk = list(prompts[start:start + CHUNK_ROWS])
        hashed = hash_prompts(chunk, params)
        eligible.append(hashed.eligible)
        keys.append(hashed.keys)
        numbers.append(hashed.number_hashes)
        progress.advance(len(chunk))
    if not eligible:
        return lsh.encode(np.zeros(0, bool), np.zeros((0, params.bands), np.uint64),
                          np.zeros(0, np.uint32), params)
    return lsh.encode(np.concatenate(eligible), np.concatenate(keys), np.concatenate(numbers),
                      params)


def settings_digest(header: dict[str, Any]) -> str:
    """The settings part of a sidecar's header, as `LshParams.digest()` names it."""
    text = json.dumps({k: v for k, v in header.items() if k not in ("rows", "entries")},
                      sort_keys=True)
    return f"{zlib.crc32(text.encode()):08x}"


def derived_rel(name: str, info: ShardInfo, digest: str, kind: Kind = LSH) -> str:
    """Where the derived sidecar of a shard, for settings `digest`, lives."""
    return f"{name}/{INDEX_DIR}/{info.sha256}-{digest}{kind.suffix}"


@dataclass(frozen=True)
class ShardIndex:
    """One shard of a version, where its rows start in the version, and its sidecar."""

    info: ShardInfo
    start: int
    sidecar: Any  # lsh.Sidecar or vectors.VecSidecar, as the kind reads it


def own_sidecar(store: StoreReader, name: str, info: ShardInfo,
                version: int | None = None, kind: Kind = LSH) -> Any | None:
    """The sidecar the record names for a shard (None if it names none)."""
    rel = getattr(info, kind.field)
    if rel is None:
        return None
    try:
        return kind.read(store.shard_path(name, info, version, rel=rel))
    except FileNotFoundError:
        raise CorruptionError(
            f"{kind.label} sidecar {rel} of dataset {name!r} is missing. Run "
            f"`dyngen verify {name}`, then `dyngen rebuild-index {name}`.") from None
    except CorruptionError as exc:
        raise CorruptionError(f"{kind.label} sidecar {rel} of dataset {name!r} is "
                              f"damaged ({exc}). Run `dyngen verify {name}`.") from exc


def derived_sidecar(store: StoreReader, name: str, info: ShardInfo,
                    digest: str, kind: Kind = LSH) -> Any | None:
    """A shard's derived sidecar for settings `digest`, if one was built."""
    rel = derived_rel(name, info, digest, kind)
    cached = f"{info.sha256}-{digest}-derived" + ("" if kind.field == "lsh" else kind.suffix)
    path = store.backend.local_copy(rel, name=cached)
    if not path.exists():
        return None
    try:
        return kind.read(path)
    except CorruptionError as exc:
        raise CorruptionError(f"derived {kind.label} sidecar {rel} is damaged ({exc}); "
                              f"delete it and run `dyngen rebuild-index {name}`.") from exc


def usable_sidecar(store: StoreReader, name: str, info: ShardInfo,
                   settings: LshParams | Kind, version: int | None = None) -> Any | None:
    """The sidecar of a shard made with `settings`: its own, else a derived one; None if
    it has neither. IndexMismatchError if its own was made otherwise and no derived one
    replaces it (`dyngen rebuild-index`)."""
    kind = as_kind(settings)
    own = own_sidecar(store, name, info, version, kind)
    if own is not None and kind.header_digest(own.header) == kind.digest():
        return own
    derived = derived_sidecar(store, name, info, kind.digest(), kind)
    if derived is not None:
        return derived
    if own is not None:
        kind.check(own.header, f"shard {info.path} of dataset {name!r}")
    return None


def build_derived(store: StoreReader, name: str, info: ShardInfo,
                  settings: LshParams | Kind, version: int | None,
                  progress: Bar = QUIET) -> Any:
    """Index a shard's prompts into its derived sidecar (kept if another process won)."""
    from dyngen.store import shards as sh

    kind = as_kind(settings)
    table = sh.open_table(store.shard_path(name, info, version)).table
    prompt_key = store.state(name, version).prompt_key
    prompts = table.column(prompt_key).to_pylist() if prompt_key in table.column_names \
        else [None] * table.num_rows
    data = kind.build(prompts, progress)
    with contextlib.suppress(FileExistsError):  # another process made it: the same bytes
        store.backend.write_new(derived_rel(name, info, kind.digest(), kind), data)
    crash_point("index.after_derived_write")
    found = derived_sidecar(store, name, info, kind.digest(), kind)
    assert found is not None
    return found


def version_index(store: StoreReader, name: str, version: int, settings: LshParams | Kind,
                  progress: Bar = QUIET) -> list[ShardIndex]:
    """Every data shard of `version` with its sidecar; shards without one are indexed now
    (one pass over their rows, reported to `progress`), then kept for every later round."""
    kind = as_kind(settings)
    state = store.state(name, version)
    found = [usable_sidecar(store, name, info, kind, version) for info in state.shards]
    missing = [i for i, sc in enumerate(found) if sc is None]
    if missing:
        total = sum(state.shards[i].rows for i in missing)
        progress.stage(f"indexing {total:,} rows of {name} for {kind.label}s", total, "rows")
        for i in missing:
            found[i] = build_derived(store, name, state.shards[i], kind, version, progress)
    out, start = [], 0
    for info, sidecar in zip(state.shards, found, strict=True):
        assert sidecar is not None
        out.append(ShardIndex(info, start, sidecar))
        start += info.rows
    return out


def rebuild_index(store: StoreReader, name: str, settings: LshParams | Kind,
                  progress: Bar = QUIET) -> int:
    """Derived sidecars, made with `settings`, for every shard a loadable version names that
    has no usable one; returns how many were built."""
    kind = as_kind(settings)
    log = store.log(name)
    head = log.head_version()
    if head is None:
        store.head(name)  # raises DatasetNotFoundError, with its advice
        return 0
    shards: dict[str, tuple[ShardInfo, int]] = {}
    for _, state in log.replay(store.state(name).expired_before, head):
        for info in state.shards:
            shards.setdefault(info.sha256, (info, state.version))
    todo = []
    for info, version in shards.values():
        own = own_sidecar(store, name, info, version, kind)
        if own is not None and kind.header_digest(own.header) == kind.digest():
            continue
        if derived_sidecar(store, name, info, kind.digest(), kind) is None:
            todo.append((info, version))
    progress.stage(f"indexing {sum(i.rows for i, _ in todo):,} rows of {name}",
                   sum(i.rows for i, _ in todo), "rows")
    for info, version in todo:
        build_derived(store, name, info, kind, version, progress)
    return len(todo)


def merged_sidecar(store: StoreReader, name: str, group: Sequence[ShardInfo],
                   version: int, kind: Kind = LSH) -> bytes | None:
    """One sidecar for shards compacted into one, from theirs (own or derived, made
    alike); None when they have none in common (the next round indexes the new shard)."""
    derived: dict[str, set[str]] = {}
    for file in store.backend.list(f"{name}/{INDEX_DIR}"):
        sha, _, rest = file.partition("-")
        if rest.endswith(kind.suffix) and not file.startswith(".tmp-"):
            derived.setdefault(sha, set()).add(rest[:-len(kind.suffix)])
    choices: list[dict[str, tuple[str, str | None]]] = []
    for info in group:
        options: dict[str, tuple[str, str | None]] = {
            d: ("derived", d) for d in derived.get(info.sha256, ())}
        own = own_sidecar(store, name, info, version, kind)
        if own is not None:
            options[kind.header_digest(own.header)] = ("own", None)
        choices.append(options)
    common = set.intersection(*(set(c) for c in choices)) if choices else set()
    if not common:
        return None
    digest = sorted(common)[0]
    parts = []
    for info, options in zip(group, choices, strict=True):
        which, _ = options[digest]
        part = own_sidecar(store, name, info, version, kind) if which == "own" \
            else derived_sidecar(store, name, info, digest, kind)
        assert part is not None
        parts.append(part)
    return kind.merge(parts)
