"""A round and its dataset's inbox: what it covers, what it finds covered, how it says so.

A round covers every batch end its dataset's inbox holds that no version covers at the
head it loaded (`Store.pending`): its generator sees them all (`RoundContext.batch_ends`,
their rollouts read from the store and checked as a trigger's rollouts file is), and the
version it commits names them (`covers`). The store's commit refuses a version covering a
batch end another version covers, so each is covered exactly once, whichever round, retry
or re-delivery commits first; the round that loses commits nothing and says which version
covered them. With nothing pending a round is what it always was: its trigger alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from dyngen.errors import (
    AlreadyCoveredError,
    BatchEndError,
    CorruptionError,
    RolloutsError,
    describe_batch_end,
)
from dyngen.round.context import RoundBatchEnd
from dyngen.round.rollouts import RolloutsPolicy
from dyngen.store import Store, VersionRecord
from dyngen.store.inbox import BatchEnd

SHOWN_RANGES = 6  # step ranges of one run written out before "… (N more)"


def pending_batch_ends(store: Store, dataset: str, version: int,
                       policy: RolloutsPolicy) -> tuple[RoundBatchEnd, ...]:
    """The batch ends no version up to `version` covers, oldest written first, each with its
    rollouts read from the store (checked by `policy`, as a trigger's file is)."""
    pending = store.pending(dataset, version=version)
    ordered = sorted(pending, key=lambda e: (e.written_at, e.run, e.step))
    return tuple(_with_rollouts(store, entry, policy) for entry in ordered)


def _with_rollouts(store: Store, entry: BatchEnd, policy: RolloutsPolicy) -> RoundBatchEnd:
    """One pending entry for the round. Rollouts that cannot be used (over the bound, not
    rollouts JSONL, missing or damaged in the store) are left out with the reason: the
    batch end is covered with its metrics, and the round does not fail on it for ever."""
    found = RoundBatchEnd(entry.run, entry.step, dict(entry.metrics), entry.written_at,
                          entry.event_id)
    if entry.rollouts is None:
        return found
    where = f"rollouts of {describe(entry.key)}"
    try:
        policy.check_size(entry.rollouts.bytes, where)
        rollouts = policy.parse(store.rollouts_bytes(entry), where)
    except (RolloutsError, BatchEndError, CorruptionError) as exc:
        return replace(found, rollouts_error=str(exc))
    return replace(found, rollouts=tuple(rollouts))


def covering_record(store: Store, exc: AlreadyCoveredError) -> VersionRecord:
    """The version that covered a lost commit's batch ends (the head if the log cannot
    tell: a damaged log)."""
    version = exc.version
    for key in exc.entries if version is None else ():
        version = store.covering_version(exc.dataset, *key)
        if version is not None:
            break
    return store.head(exc.dataset) if version is None else store.record(exc.dataset, version)


# ---- lineage ---------------------------------------------------------------------------
def covers_lineage(batch_ends: Sequence[RoundBatchEnd]) -> dict[str, list[int]]:
    """The lineage's short form of what a version covers: per run, its steps ascending."""
    out: dict[str, list[int]] = {}
    for run, step in sorted(b.key for b in batch_ends):
        out.setdefault(run, []).append(step)
    return out


def rollouts_errors(batch_ends: Sequence[RoundBatchEnd]) -> list[dict[str, Any]]:
    """The batch ends whose rollouts the round could not use, and why."""
    return [{"run": b.run, "step": b.step, "error": b.rollouts_error}
            for b in batch_ends if b.rollouts_error]


# ---- words -------------------------------------------------------------------------------
describe = describe_batch_end  # a batch end in messages: `run 'a' step 3`


def covers_text(covers: Iterable[Sequence[Any]] | Mapping[str, Any]) -> str:
    """What a version covers, in a few words: `run-a steps 3–5, 7 · run-b step 1`.

    `covers`: a record's (run, step) pairs, or a lineage's `{run: [steps]}`; "" for none.
    """
    by_run: dict[str, set[int]] = {}
    items = covers.items() if isinstance(covers, Mapping) else (
        (k[0], [k[1]]) for k in covers if isinstance(k, (tuple, list)) and len(k) == 2)
    for run, steps in items:
        if isinstance(steps, list):
            by_run.setdefault(str(run), set()).update(
                s for s in steps if isinstance(s, int) and not isinstance(s, bool))
    return " · ".join(_run_text(run, sorted(steps)) for run, steps in sorted(by_run.items())
                      if steps)


def _run_text(run: str, steps: list[int]) -> str:
    ranges: list[list[int]] = []
    for step in steps:
        if ranges and step == ranges[-1][1] + 1:
            ranges[-1][1] = step
        else:
            ranges.append([step, step])
    shown = [f"{a}" if a == b else f"{a}–{b}" for a, b in ranges[:SHOWN_RANGES]]
    if len(ranges) > SHOWN_RANGES:
        shown.append(f"… ({len(ranges) - SHOWN_RANGES} more)")
    word = "step" if len(steps) == 1 else "steps"
    return f"{run[:80]} {word} {', '.join(shown)}"
