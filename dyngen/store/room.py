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
# errno -> what ran out, for a message about the store's disk.
_NO_ROOM = {
    errno.ENOSPC: "the disk holding store {root} is full",
    errno.EDQUOT: "the disk quota for store {root} is used up",
    errno.EFBIG: "a file of store {root} would grow past the largest file size allowed "
                 "(the file system's, or this process's `ulimit -f`)",
}


def no_room(store: StoreReader, dataset: str | None, exc: OSError) -> StoreFullError | None:
    """The StoreFullError for `exc` if it says a local store's disk had no room, else None."""
    if isinstance(exc, StoreFullError) or exc.errno not in _NO_ROOM \
            or not isinstance(store.root, Path):
        return None
    cause = _NO_ROOM[exc.errno].format(root=store.root)
    where = f", writing {exc.filename}" if exc.filename else ""
    state = ""
    if dataset is not None:
        try:
            head = store.head_version(dataset)
        except Exception:  # the message must not fail; its head is then left unsaid
            head = -1
        state = (f": dataset {dataset!r} was not created" if head is None else
                 f": dataset {dataset!r} is at version {head}" if head >= 0 else "")
    return StoreFullError(
        f"{cause} ({exc.strerror or 'no room'}{where}). Nothing was committed{state}. Free "
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
