"""A trigger's rollouts file: confined to the deployment's folders, bounded, never echoed.

(A batch end's rollouts held in the store's inbox are read by the store and checked here
the same way: `RolloutsPolicy.parse`, the bound, and the format of dyngen.rollout_format.)

A batch-end event names `trigger.rollouts`, a path the round opens where it runs, with
the worker's rights. So a path is accepted only inside `round.rollouts_dirs` (checked
after resolving links), only as a regular file of at most `round.max_rollouts_bytes`;
the checks are repeated on the opened file, so a swap between check and open gains
nothing. Errors name the allowed folders, the rule, the line and the field — never the
file's text.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Any

from dyngen.errors import ConfigError, RolloutsError
from dyngen.rollout_format import Rollout, parse_rollouts

DEFAULT_MAX_ROLLOUTS_BYTES = 64 * 1024 * 1024
MAX_SHOWN_PATH = 200
_NOT_REGULAR = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                (stat.S_ISSOCK, "a socket"))
# Non-blocking: opening a FIFO must not wait for a writer. No-follow: a final component
# swapped for a link after the check fails to open.
_OPEN_FLAGS = (os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
               | getattr(os, "O_CLOEXEC", 0))


@dataclass(frozen=True)
class RolloutsPolicy:
    """Where a round may read a trigger's rollouts file, and how large it may be."""

    dirs: tuple[str, ...] = ()
    max_bytes: int = DEFAULT_MAX_ROLLOUTS_BYTES

    @classmethod
    def from_config(cls, cfg: Any) -> RolloutsPolicy:
        """`round.rollouts_dirs` and `round.max_rollouts_bytes` of a round's config."""
        return cls(tuple(str(d) for d in cfg.round.rollouts_dirs),
                   int(cfg.round.max_rollouts_bytes))

    def check(self, path: str) -> str:
        """The resolved path of an allowed, regular, small-enough file; else RolloutsError.

        Nothing is opened: only names and metadata are looked at.
        """
        where = _where(path)
        if not isinstance(path, str) or not path or "\0" in path:
            raise RolloutsError(f"{where}: expected a file path, found an empty or malformed "
                                "one.")
        if not os.path.isabs(path):
            raise RolloutsError(f"{where}: expected an absolute path (the round runs in another "
                                "folder than the trainer), found a relative one.")
        real = os.path.realpath(path)
        if not self._allows(real):
            raise RolloutsError(
                f"{where} is outside the allowed directories {self._shown_dirs()} (checked "
                "after resolving links). A round reads rollouts only from round.rollouts_dirs "
                "of the deployment's config: write the file there, or add its folder to "
                "round.rollouts_dirs where the round is served.")
        try:
            info = os.stat(real)
        except OSError as exc:
            raise RolloutsError(f"{where} {_os_problem(exc)} (allowed directories "
                                f"{self._shown_dirs()}).") from None
        self._check_kind_and_size(where, info)
        return real

    def read(self, path: str) -> list[Rollout]:
        """The rollouts of an allowed file, checked again once opened, read within the bound."""
        real = self.check(path)
        where = _where(path)
        try:
            fd = os.open(real, _OPEN_FLAGS)
        except OSError as exc:
            raise RolloutsError(f"{where} could not be opened: it {_os_problem(exc)} (or it "
                                "changed after it was checked).") from None
        try:
            self._check_kind_and_size(where, os.fstat(fd))
            opened = _opened_path(fd)
            if opened is not None and not self._allows(opened):
                raise RolloutsError(f"{where} changed after it was checked: the opened file is "
                                    f"outside the allowed directories {self._shown_dirs()}.")
            data = _read_at_most(fd, self.max_bytes + 1)
        finally:
            os.close(fd)
        if len(data) > self.max_bytes:
            raise RolloutsError(f"{where} grew past round.max_rollouts_bytes={self.max_bytes} "
                                "while it was read; write each batch's file once, completely.")
        return parse_rollouts(data, where)

    def check_size(self, size: int, where: str,
                   advice: str = "Send fewer rollouts per batch") -> None:
        """RolloutsError if `size` bytes of rollouts (a file's, or a batch end's in the
        store) are over round.max_rollouts_bytes."""
        if size > self.max_bytes:
            raise RolloutsError(
                f"{where}: {size} bytes, over the bound round.max_rollouts_bytes="
                f"{self.max_bytes}. {advice}, or raise the bound in the deployment's config.")

    def parse(self, data: bytes, where: str) -> list[Rollout]:
        """Rollouts from JSONL bytes read elsewhere (a batch end's, from the store): the
        same bound and checks as a file's; errors name the line and field, never the text."""
        self.check_size(len(data), where)
        return parse_rollouts(data, where)

    def _check_kind_and_size(self, where: str, info: os.stat_result) -> None:
        kind = next((name for test, name in _NOT_REGULAR if test(info.st_mode)), None)
        if kind is not None or not stat.S_ISREG(info.st_mode):
            raise RolloutsError(f"{where} is {kind or 'not a regular file'}; expected a regular "
                                "JSONL file.")
        self.check_size(info.st_size, where, advice="Write a smaller file per batch")

    def _real_dirs(self) -> list[str]:
        out = []
        for i, d in enumerate(self.dirs):
            local = d[len("file://"):] if d.startswith("file://") else d
            if "://" in local or not local:
                raise ConfigError(
                    f"round.rollouts_dirs[{i}]: expected a local folder, found {d!r}. Rollouts "
                    "files are read from the disk where the round runs; set round.rollouts_dirs "
                    "to such a folder (its default is one, also for a store on object "
                    "storage: README, Storage backends).")
            out.append(os.path.realpath(local))
        return out

    def _allows(self, real: str) -> bool:
        return any(real == d or real.startswith(d.rstrip(os.sep) + os.sep)
                   for d in self._real_dirs())

    def _shown_dirs(self) -> list[str]:
        return list(self.dirs) or ["none configured: set round.rollouts_dirs"]


def _where(path: Any) -> str:
    shown = repr(path) if len(repr(path)) <= MAX_SHOWN_PATH else repr(path)[:MAX_SHOWN_PATH] + "…"
    return f"trigger.rollouts {shown}"


def _os_problem(exc: OSError) -> str:
    if isinstance(exc, FileNotFoundError):
        return "does not exist"
    if isinstance(exc, PermissionError):
        return "cannot be read by the worker (permission denied)"
    return f"cannot be accessed ({exc.strerror or type(exc).__name__})"


def _opened_path(fd: int) -> str | None:
    """Where an open file really is (Linux), to re-check the folder after opening."""
    try:
        return os.path.realpath(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        return None  # no /proc: O_NOFOLLOW and the fstat checks remain


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks, size = [], 0
    while size < limit:
        chunk = os.read(fd, min(1 << 20, limit - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)
