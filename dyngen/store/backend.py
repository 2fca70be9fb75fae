"""Every file operation of the store, behind one small interface: local files today.

The store names files by paths relative to its root (`"ds/_versions/…json"`) and never
touches the OS directly, so a backend for object storage (fsspec: `s3://` with a
conditional put for exclusive creation, `memory://`, a local cache of shards to
memory-map) can replace `LocalBackend` without changing the store's logic. Files are
immutable: the only write that replaces a file is `replace`, used for hints that are
an optimisation and may be stale.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

Writer = Callable[[BinaryIO], None]
# Told "written" once the temp file is durable and "linked" once it has its name: the
# store places its crash points there (see dyngen.faults).
StageHook = Callable[[str], None]


@dataclass(frozen=True)
class FileInfo:
    """Size and modification time of a stored file, and an identity that changes with it."""

    size: int
    mtime: float
    identity: tuple[int, int, int]  # (inode, size, mtime_ns): a replaced file differs


class LocalBackend:
    """Files under one local folder; paths are POSIX-style and relative to it."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def local_path(self, rel: str) -> Path:
        """A local path of `rel` that can be memory-mapped (the file itself, locally)."""
        return self.root / rel

    def write_new(self, rel: str, data: bytes | Writer, *,
                  hook: StageHook | None = None) -> None:
        """Create `rel` durably with `data`; FileExistsError if it exists (it is kept).

        The bytes go to a temp file that is fsynced, then hard-linked to its name: a
        crash never leaves a partial file under the real name, and a link never
        replaces a file that exists. The folder is fsynced so the name survives too.
        """
        path = self.root / rel
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
            if hook is not None:
                hook("written")
            os.link(tmp, path)
            if hook is not None:
                hook("linked")
        finally:
            tmp.unlink(missing_ok=True)
        _fsync_dir(path.parent)

    def create_exclusive(self, rel: str, data: bytes) -> bool:
        """Create a small file durably unless it exists; tell whether this call created it."""
        try:
            self.write_new(rel, data)
        except FileExistsError:
            return False
        return True

    def replace(self, rel: str, data: bytes) -> None:
        """Atomically set the content of a small mutable hint file (readers see old or new)."""
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".tmp-{uuid.uuid4().hex[:12]}-{path.name}")
        try:
            with open(tmp, "xb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
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
        return FileInfo(st.st_size, st.st_mtime, (st.st_ino, st.st_size, st.st_mtime_ns))

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
