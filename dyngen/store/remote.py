"""The store on an fsspec filesystem (`s3://`, `gs://`, `memory://`, …): `FsspecBackend`.

The commit rule is the local one: a version exists when its record is created
exclusively. Each scheme says how it creates a file exclusively (see `EXCLUSIVE`):
S3 with a conditional put (`If-None-Match: *`), GCS with `ifGenerationMatch=0`, the
in-process memory filesystem under a lock. A filesystem with no such operation writes
only in single-writer mode, where the user promises that one process writes the store;
so does a zonal ("Rapid") GCS bucket, where gcsfs uploads through appendable objects
that ignore `mode="create"` (they overwrite). Shards are read from a local cache
(dyngen/store/cache.py) so they can be memory-mapped.
"""

from __future__ import annotations

import io
import logging
import threading
import time
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from dyngen.errors import StoreError
from dyngen.store.backend import ExclusiveCreate, FileInfo, StageHook, Writer
from dyngen.store.cache import ShardCache

# Scheme -> how it creates a file only if absent, atomically against other writers.
EXCLUSIVE = {
    "s3": "conditional put (If-None-Match: *)",
    "s3a": "conditional put (If-None-Match: *)",
    "gs": "generation precondition (ifGenerationMatch=0)",
    "gcs": "generation precondition (ifGenerationMatch=0)",
    "memory": "existence check under a lock (one process: the memory filesystem is per process)",
}
_GCS = frozenset({"gs", "gcs"})
# The memory filesystem's files are one dict per process, so one lock makes its check-then-
# write exclusive for every Store in the process (and there are no other processes).
_MEMORY_LOCK = threading.Lock()
logger = logging.getLogger(__name__)


def zonal_bucket(metadata: Mapping[str, Any]) -> bool:
    """Whether a GCS bucket resource (JSON API: `storageClass`, `locationType`) is zonal.

    A zonal bucket has one zone as its location and the Rapid storage class; gcsfs creates
    one with `storageClass: RAPID` and a zone placement, and recognises one by its storage
    layout's location type `zone`.
    """
    storage_class = str(metadata.get("storageClass") or "").upper()
    location_type = str(metadata.get("locationType") or "").lower()
    return storage_class == "RAPID" or location_type == "zone"


class FsspecBackend(ExclusiveCreate):
    """Files under one folder of an fsspec filesystem; paths are relative to it."""

    def __init__(self, fs: Any, root_path: str, url: str, scheme: str, cache: ShardCache, *,
                 single_writer: bool = False) -> None:
        self.fs = fs
        self.base = root_path.rstrip("/")
        self.root = url.rstrip("/")
        self.scheme = scheme
        self.cache = cache
        self.single_writer = single_writer
        self.exclusive_create = EXCLUSIVE.get(scheme)
        self._zonal: str | None = None  # a GCS bucket's zonal metadata, once checked
        self._zonal_checked = scheme not in _GCS

    def _path(self, rel: str) -> str:
        return f"{self.base}/{rel}".rstrip("/") if rel else self.base

    def describe(self, rel: str) -> str:
        """Where `rel` is, for messages (its URL)."""
        return f"{self.root}/{rel}"

    def local_copy(self, rel: str, *, sha256: str | None = None, size: int | None = None,
                   name: str | None = None) -> Path:
        """A local, memory-mappable copy of `rel` from the shard cache (fetched if needed)."""
        return self.cache.copy_of(self, rel, sha256=sha256, size=size, name=name)

    def check_writable(self) -> None:
        """Refuse to write where exclusive creation is not atomic, unless single-writer."""
        zonal = self._zonal_bucket()
        if zonal is not None and not self.single_writer:
            bucket = self.base.split("/", 1)[0]
            raise StoreError(
                f"store {self.root} is in GCS bucket {bucket!r}, a zonal (Rapid storage) "
                f"bucket ({zonal}). gcsfs writes there through appendable uploads that ignore "
                "create-only mode and overwrite, so two writers could both commit the same "
                "version. Expected a regional, dual-region or multi-region bucket; found a "
                "zonal one. If only one process ever writes this store, set "
                "store.single_writer: true (Store(root, single_writer=True)); otherwise move "
                "the store to another bucket (README: Storage backends)."
            )
        if self.exclusive_create is None and not self.single_writer:
            raise StoreError(
                f"store {self.root} is on {self.scheme}://, which has no atomic "
                "create-if-absent, so two writers could both commit the same version. "
                "Expected a store on a local path, file://, s3://, gs:// or memory://; "
                f"found {self.scheme}://. If only one process ever writes this store, set "
                "store.single_writer: true (Store(root, single_writer=True)); otherwise move "
                "the store to a backend with exclusive creation (README: Storage backends)."
            )

    def _zonal_bucket(self) -> str | None:
        """For a GCS store, what makes its bucket zonal (read once); None if it is not."""
        if self._zonal_checked:
            return self._zonal
        bucket = self.base.split("/", 1)[0]
        try:
            metadata = self.fs.info(bucket)
        except Exception as exc:  # no storage.buckets.get: writing is still allowed
            logger.warning("dyngen: could not read the metadata of GCS bucket %r to check "
                           "that it is not zonal (%s); if it is, commits are not exclusive "
                           "(README: Storage backends)", bucket, exc)
            metadata = {}
        if zonal_bucket(metadata):
            self._zonal = (f"storageClass {metadata.get('storageClass')}, locationType "
                           f"{metadata.get('locationType')}")
        self._zonal_checked = True
        return self._zonal

    def write_new(self, rel: str, data: bytes | Writer, *,
                  hook: StageHook | None = None) -> None:
        """Create `rel` with `data`; FileExistsError if it exists (it is kept)."""
        self.check_writable()
        if callable(data):
            buffer = io.BytesIO()
            data(buffer)
            payload = buffer.getvalue()
        else:
            payload = bytes(data)
        if hook is not None:
            hook("written")
        path = self._path(rel)
        # Single-writer on a backend without exclusive creation: at least never overwrite.
        if self.scheme == "memory" or self.exclusive_create is None or self._zonal:
            with _MEMORY_LOCK:
                if self.fs.exists(path):
                    raise FileExistsError(self.describe(rel))
                self.fs.pipe_file(path, payload)
        else:
            # s3fs sends If-None-Match on single puts (< 100 MB); larger uploads are
            # multipart without it, which only shards are, and their names are unique.
            try:
                self.fs.pipe_file(path, payload, mode="create")
            except FileExistsError:
                raise FileExistsError(self.describe(rel)) from None
            except OSError:
                # Some servers report the failed precondition as a generic error (412).
                if self.fs.exists(path):
                    raise FileExistsError(self.describe(rel)) from None
                raise
        if hook is not None:
            hook("linked")

    def replace(self, rel: str, data: bytes) -> None:
        """Set the content of a small mutable hint file (one put: readers see old or new)."""
        self.check_writable()
        self.fs.pipe_file(self._path(rel), data)

    def read_bytes(self, rel: str) -> bytes:
        """The content of `rel`; FileNotFoundError if it does not exist."""
        return self.fs.cat_file(self._path(rel))

    def exists(self, rel: str) -> bool:
        """Whether a file `rel` exists."""
        return bool(self.fs.isfile(self._path(rel)))

    def stat(self, rel: str) -> FileInfo:
        """Size and modification time of `rel`; FileNotFoundError if it does not exist."""
        info = self.fs.info(self._path(rel))
        if info.get("type") == "directory":
            raise FileNotFoundError(self.describe(rel))
        return FileInfo(int(info.get("size") or 0), _mtime(info))

    def list(self, folder: str) -> list[str]:
        """Names of the files directly inside `folder` (none if it does not exist)."""
        return self._scan(folder, "file")

    def list_dirs(self, folder: str) -> list[str]:
        """Names of the folders directly inside `folder`."""
        return self._scan(folder, "directory")

    def _scan(self, folder: str, kind: str) -> list[str]:
        path = self._path(folder)
        try:
            entries = self.fs.ls(path, detail=True, refresh=True)
        except (FileNotFoundError, NotADirectoryError):
            return []
        names = []
        for entry in entries:
            name = str(entry["name"]).rstrip("/").rsplit("/", 1)[-1]
            if entry.get("type") == kind and str(entry["name"]).strip("/") != path.strip("/"):
                names.append(name)
        return names

    def delete(self, rel: str) -> bool:
        """Remove `rel`; tell whether it existed."""
        path = self._path(rel)
        if not self.fs.isfile(path):
            return False
        try:
            self.fs.rm_file(path)
        except FileNotFoundError:
            return False
        return True


def _mtime(info: dict[str, Any]) -> float:
    """Modification time in epoch seconds from an fsspec info dict (keys vary by backend)."""
    for key in ("LastModified", "mtime", "updated", "created"):
        value = info.get(key)
        if isinstance(value, datetime):
            return value.timestamp()
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return time.time()  # unknown: count it as new, so nothing is deleted on a guess
