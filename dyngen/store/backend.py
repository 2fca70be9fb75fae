"""Every file operation of the store, behind one small interface; here, local files.

The store names files by paths relative to its root (`"ds/_versions/…json"`) and never
touches the OS directly, so `FsspecBackend` (dyngen/store/remote.py: `s3://`, `gs://`,
`memory://`, with a local cache of shards to memory-map) replaces `LocalBackend`
without changing the store's logic. Files are immutable: the only write that replaces a
file is `replace`, used for hints that are an optimisation and may be stale.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

Writer = Callable[[BinaryIO], None]
# Told "written" once the temp file is durable and "linked" once it has its name: the
# store places its crash points there (see dyngen.faults).
StageHook = Callable[[str], None]


@dataclass(frozen=True)
class FileInfo:
    """Size and modification time (seconds since the epoch) of a stored file."""

    size: int
    mtime: float


class Backend(Protocol):
    """What the store needs of a backend (LocalBackend, remote.FsspecBackend)."""

    root: Path | str  # a local folder, or the store's URL
    exclusive_create: str | None  # how a file is created only if absent; None: no way

    def describe(self, rel: str) -> str: ...
    def local_copy(self, rel: str, *, sha256: str | None = None, size: int | None = None,
                   name: str | None = None) -> Path: ...
    def write_new(self, rel: str, data: bytes | Writer, *,
                  hook: StageHook | None = None) -> None: ...
    def create_exclusive(self, rel: str, data: bytes) -> bool: ...
    def replace(self, rel: str, data: bytes) -> None: ...
    def read_bytes(self, rel: str) -> bytes: ...
    def exists(self, rel: str) -> bool: ...
    def stat(self, rel: str) -> FileInfo: ...
    def list(self, folder: str) -> list[str]: ...
    def list_dirs(self, folder: str) -> list[str]: ...
    def delete(self, rel: str) -> bool: ...


class ExclusiveCreate:
    """`create_exclusive` for a backend from its `write_new`."""

    def write_new(self, rel: str, data: bytes | Writer, *,
                  hook: StageHook | None = None) -> None:
        """Create `rel` with `data`; FileExistsError if it exists."""
        raise NotImplementedError

    def create_exclusive(self, rel: str, data: bytes) -> bool:
        """Create a small file durably unless it exists; tell whether this call created it."""
        try:
            self.write_new(rel, data)
        except FileExistsError:
            return False
        return True


class LocalBackend(ExclusiveCreate):
    """Files under one local folder; paths are POSIX-style and relative to it."""

    # A hard link never replaces a file: exclusive creation is atomic across processes.
    exclusive_create = "hard link (os.link)"

    def __init__(self, root: Path) -> None:
        self.root = root

    def describe(self, rel: str) -> str:
        """Where `rel` is, for messages (an absolute path)."""
        return str(self.root / rel)

    def local_copy(self, rel: str, *, sha256: str | None = None, size: int | None = None,
                   name: str | None = None) -> Path:
        """A local path of `rel` that can be memory-mapped: the file itself.

        `sha256`, `size` (what the record expects) and `name` (a cache name) matter only
        to a remote backend, which fetches the file into its cache; callers check the
        file they get.
        """
        return self.root / rel

    def write_new(self, rel: str, data: bytes | Writer, *,
                  hook: StageHook | None = None) -> None:
        """Create `rel` durably with `data`; FileExistsError if it exists (it is kept).

        The bytes go to a temp file that is fsynced, then hard-linked to its name: a
        crash never leaves a partial file under the real name, and a link never
        replaces a file that exists. The folder is fsynced so the name survives too.
        """
        path = self.root / rel
        tmp = durable_temp(path, data)
        try:
            if hook is not None:
                hook("written")
            os.link(tmp, path)
            if hook is not None:
                hook("linked")
        finally:
            tmp.unlink(missing_ok=True)
        _fsync_dir(path.parent)

    def replace(self, rel: str, data: bytes) -> None:
        """Atomically set the content of a small mutable hint file (readers see old or new)."""
        path = self.root / rel
        tmp = durable_temp(path, data)
        try:
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)

    def read_bytes(self, rel: str) -> bytes:
        """The content of `rel`; FileNotFoundError if it does not exist."""
        with open(self.root / rel, "rb") as fh:
            return fh.read()

    def exists(self, rel: str) -> bool:
        """Whether a file `rel` exists."""
        return os.path.isfile(self.root / rel)

    def stat(self, rel: str) -> FileInfo:
        """Size and mtime of `rel`; FileNotFoundError if it does not exist."""
        st = os.stat(self.root / rel)
        return FileInfo(st.st_size, st.st_mtime)

    def list(self, folder: str) -> list[str]:
        """Names of the files directly inside `folder` (none if it does not exist)."""
        return self._scan(folder, dirs=False)

    def list_dirs(self, folder: str) -> list[str]:
        """Names of the folders directly inside `folder`."""
        return self._scan(folder, dirs=True)

    def _scan(self, folder: str, *, dirs: bool) -> list[str]:
        try:
            with os.scandir(self.root / folder) as entries:
                return [e.name for e in entries
                        if (e.is_dir if dirs else e.is_file)(follow_symlinks=False)]
        except (FileNotFoundError, NotADirectoryError):
            return []

    def delete(self, rel: str) -> bool:
        """Remove `rel`; tell whether it existed."""
        try:
            os.unlink(self.root / rel)
        except FileNotFoundError:
            return False
        return True


def durable_temp(path: Path, data: bytes | Writer) -> Path:
    """Write `data` to a new fsynced temp file beside `path` (creating its folder)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{uuid.uuid4().hex[:12]}-{path.name}")
    try:
        with open(tmp, "xb") as fh:
            if callable(data):
                data(fh)
            else:
                fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def replace_durably(path: Path, data: bytes | Writer) -> Path:
    """Set `path`'s whole content: an fsynced temp file renamed over it (readers see the old
    file or the new one, never half of one). For files that may be replaced; a store's
    immutable files are created with `write_new`."""
    tmp = durable_temp(path, data)
    try:
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _fsync_dir(folder: Path) -> None:
    """Make a directory entry durable (a no-op where the platform cannot)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
