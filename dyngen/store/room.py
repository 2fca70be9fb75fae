"""A write that finds no room on a local store's disk, as an error a user can act on.

The kernel says only `No space left on device`. A shard or record that could not be
written is never named by a version, so the commit it belonged to did not happen: the
error says so, names the store and the dataset, and says what to do.
"""

from __future__ import annotations

import errno
import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from dyngen.errors import StoreFullError

if TYPE_CHECKING:
    from dyngen.store.reader import StoreReader

_T = TypeVar("_T")
# errno -> what ran out, for a message about the disk of `what` (a store, a mirror).
_NO_ROOM = {
    errno.ENOSPC: "the disk holding {what} is full",
    errno.EDQUOT: "the disk quota for {what} is used up",
    errno.EFBIG: "a file of {what} would grow past the largest file size allowed "
                 "(the file system's, or this process's `ulimit -f`)",
}


def no_room_cause(exc: BaseException, what: str) -> str | None:
    """What ran out ("the disk holding {what} is full (No space left on device, writing
    F)"), if `exc` is a write that found no room; else None."""
    if not isinstance(exc, OSError) or exc.errno not in _NO_ROOM:
        return None
    where = f", writing {exc.filename}" if exc.filename else ""
    return f"{_NO_ROOM[exc.errno].format(what=what)} ({exc.strerror or 'no room'}{where})"


def no_room(store: StoreReader, dataset: str | None, exc: OSError) -> StoreFullError | None:
    """The StoreFullError for `exc` if it says a local store's disk had no room, else None."""
    cause = no_room_cause(exc, f"store {store.root}")
    if isinstance(exc, StoreFullError) or cause is None or not isinstance(store.root, Path):
        return None
    state = ""
    if dataset is not None:
        try:
            head = store.head_version(dataset)
        except Exception:  # the message must not fail; its head is then left unsaid
            head = -1
        state = (f": dataset {dataset!r} was not created" if head is None else
                 f": dataset {dataset!r} is at version {head}" if head >= 0 else "")
    return StoreFullError(
        f"{cause}. Nothing was committed{state}. Free "
        f"space on that disk (`df -h {store.root}`) or move the store to a larger one "
        f"(--root, store.root), then run again; `dyngen gc {dataset or 'NAME'}` removes what "
        "failed writes left behind.", exc.errno, exc.strerror, exc.filename)


def reports_full_disk(method: Callable[..., _T]) -> Callable[..., _T]:
    """Turn a store method's no-room OSError into StoreFullError; its first argument names
    the dataset (a name, or a PendingCommit)."""

    @functools.wraps(method)
    def wrapper(store: Any, target: Any, *args: Any, **kwargs: Any) -> _T:
        try:
            return method(store, target, *args, **kwargs)
        except OSError as exc:
            dataset = target if isinstance(target, str) else getattr(target, "dataset", None)
            error = no_room(store, dataset, exc)
            if error is None:
                raise
            raise error from exc

    return wrapper
