"""What a commit that covers batch ends checks, against the state of its parent.

A version may cover only entries its dataset's inbox holds, none that an older version
covers, and each run's steps in order: not step s of run r while an earlier step of r in
the inbox is neither covered already nor covered by this version. The check runs as the
record is about to be created, on the parent's state: that state is fixed (a concurrent
commit makes the creation fail, and the rebase checks again on the new head). So every
batch end is covered by one version at most, whichever round, retry or re-delivery
commits first.

A commit refused is refused whole: if ANY of its batch ends is covered meanwhile, nothing
is committed and its shards are removed (AlreadyCoveredError). Its rows were generated
from all of its batch ends together, so none of them can land for only some; a round
reads what is still pending and runs again. An idempotency key already committed wins
over this check: the version that committed it is returned, as always.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dyngen.errors import CorruptionError
from dyngen.store import inbox
from dyngen.store.covered import (
    EMPTY,
    AlreadyCoveredError,
    CoverageOrderError,
    Key,
    NotInInboxError,
    describe,
)

if TYPE_CHECKING:
    from dyngen.store.backend import Backend
    from dyngen.store.log import VersionLog
    from dyngen.store.records import PendingCommit
    from dyngen.store.state import LogState
    from dyngen.store.writer import StoreWriter

_WALK_BACK = 64  # records read back from the head before bisecting on states


def check_covers(backend: Backend, log: VersionLog, covers: tuple[Key, ...],
                 parent: LogState | None) -> None:
    """Raise the CoverageError a version covering `covers` on `parent` deserves, if any."""
    dataset = log.dataset
    covered = parent.covered if parent is not None else EMPTY
    head = parent.version if parent is not None else -1
    already = tuple(k for k in covers if k in covered)
    if already:
        raise AlreadyCoveredError(dataset, covering_version(log, already[0], head), already,
                                  head)
    by_run: dict[str, set[int]] = {}
    for run, step in covers:
        by_run.setdefault(run, set()).add(step)
    for run, mine in sorted(by_run.items()):
        present = inbox.steps(backend, dataset, run)
        missing = sorted(mine.difference(present))
        if missing:
            raise NotInInboxError(
                f"dataset {dataset!r}: this commit covers {describe((run, missing[0]))}"
                f"{f' and {len(missing) - 1} more' if len(missing) > 1 else ''}, which the "
                f"inbox does not hold; expected batch ends that Store.pending returned. "
                "Nothing was committed: cover only batch ends written to the store.")
        top = max(mine)
        skipped = [s for s in present if s < top and s not in mine and (run, s) not in covered]
        if skipped:
            raise CoverageOrderError(
                f"dataset {dataset!r}: this commit covers {describe((run, top))} but not "
                f"step {skipped[0]}{f' (and {len(skipped) - 1} more)' if len(skipped) > 1 else ''}"
                f" of that run, which the inbox holds and no version covers; expected each "
                "run's steps covered in order. Nothing was committed: read Store.pending "
                "again (an earlier step arrived late) and cover it with the rest.")


def refuse_if_covered(store: StoreWriter, pending: PendingCommit, head: LogState) -> None:
    """On a rebase: abort `pending` and raise AlreadyCoveredError if the new head covers any
    of its batch ends (unless its idempotency key is committed: that commit returns it)."""
    already = tuple(k for k in pending.covers if k in head.covered)
    if not already:
        return
    key = pending.idempotency_key
    if key is not None and store.find_idempotency_key(pending.dataset, key) is not None:
        return
    store.abort(pending)
    log = store.log(pending.dataset)
    raise AlreadyCoveredError(pending.dataset, covering_version(log, already[0], head.version),
                              already, head.version)


def covering_version(log: VersionLog, key: Key, at: int) -> int | None:
    """The version (at most `at`) whose record covers `key`; None if none does.

    Reads records back from `at` (a race is lost to a recent version), then bisects on
    states (the covered set only grows): O(log N) states for an old one.
    """
    try:
        if key not in log.state(at).covered:
            return None
        for version in range(at, max(at - _WALK_BACK, -1), -1):
            if key in log.entry(version).covers:
                return version
        low, high = 0, at - _WALK_BACK  # state(high) covers it: no record after it does
        if high < 0:
            return None  # covered by no record: carried over damage by a restore
        while low < high:
            middle = (low + high) // 2
            low, high = (low, middle) if key in log.state(middle).covered else (middle + 1, high)
        return low if key in log.entry(low).covers else None
    except (CorruptionError, OSError):
        return None  # a damaged log: the error says "a version up to <head>"
