"""The local cache of a remote store's shards, so readers can memory-map them.

Shards are immutable and their records carry each one's sha256, so a cached copy is
named by that hash (`<cache>/<hh>/<sha256>.arrow`; a shard's prompt-key file by the
shard's hash and its own name) and is valid exactly when its content still has that
hash: stores and datasets share copies, a deleted cache is refilled on the next read,
and a copy whose hash no longer matches (a damaged disk, an interrupted copy by an old
process) is fetched again. Copies are written to a temp file and renamed into place, so
processes filling the same cache never see half a file.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Protocol

from dyngen.locations import user_cache
from dyngen.store import shards as sh
from dyngen.store.backend import replace_durably

CACHE_ENV = "DYNGEN_CACHE_DIR"


class _Readable(Protocol):
    def read_bytes(self, rel: str) -> bytes: ...


def default_cache_dir() -> Path:
    """$DYNGEN_CACHE_DIR, else `dyngen/shards` under the user's cache folder."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    return user_cache("shards")


class ShardCache:
    """Content-addressed local copies of remote shard files."""

    def __init__(self, folder: str | os.PathLike[str] | None = None) -> None:
        self.folder = Path(folder).expanduser() if folder else default_cache_dir()

    def path_for(self, rel: str, *, sha256: str | None, name: str | None = None) -> Path:
        """Where the copy of `rel` goes: by the shard's hash (and `name` for its key file)."""
        suffix = Path(rel).suffix
        stem = sha256 if name is None and sha256 else name or hashlib.sha256(
            rel.encode()).hexdigest()
        return self.folder / stem[:2] / f"{stem}{suffix}"

    def copy_of(self, backend: _Readable, rel: str, *, sha256: str | None = None,
                size: int | None = None, name: str | None = None) -> Path:
        """A valid local copy of `rel`, fetched if absent or stale.

        `sha256` is the file's own hash (a shard); without it (a prompt-key file, named
        by `name`) the expected `size` decides. A file the remote lacks gives a path
        that does not exist, so the caller reports it missing, as for a local store.
        """
        target = self.path_for(rel, sha256=sha256, name=name)
        if _valid(target, sha256, size):
            return target
        try:
            data = backend.read_bytes(rel)
        except FileNotFoundError:
            target.unlink(missing_ok=True)
            return target
        # Durable before it has its name: a prompt-key copy is trusted by its size alone.
        replace_durably(target, data)
        # Kept even if its hash differs from the record: the caller's check reports the
        # damage, and the next read fetches it again.
        if sha256 is not None and hashlib.sha256(data).hexdigest() == sha256:
            sh.mark_verified(target)
        return target


def _valid(path: Path, sha256: str | None, size: int | None) -> bool:
    """Whether a cached copy exists with the expected size and hash."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return False
    if size is not None and st.st_size != size:
        return False
    if sha256 is None:
        return True
    if sh.is_verified(path):
        return True
    if sh.file_sha256(path) != sha256:
        return False
    sh.mark_verified(path)
    return True
