"""A trainer's batch end into its dataset's inbox: written, or queued; never raising.

`record_batch_end` is what every trainer path does before it sends the event: it writes the
batch end (training run, step, metrics, rollouts) with `Store.write_batch_end`, which
creates one immutable entry per (run, step), so a resumed run re-sending its steps lands
nothing twice. The write runs in a helper thread and is waited for at most
STORE_WAIT_SECONDS: a store that does not answer in time, or cannot be reached, costs the
trainer that long at most, and the batch end waits in the local retry queue
(dyngen.trainers.inbox_queue), which the next write to that store empties first. What the
trainer got wrong (a run id, rollouts the store cannot hold) is logged, never raised; a
metric the store would refuse is left out (`store_metrics`: the rule every trainer path,
and its event, applies).

The training run's identity: the `run` given, else `$DYNGEN_RUN`, else DEFAULT_RUN. A
resumed run and a new run can only be told apart by their names: two runs under one name
are one run to the store, and the later one's steps that the first sent land nothing.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from dyngen.store.covered import check_run, check_step
from dyngen.store.inbox_input import MAX_METRICS, MAX_TEXT, check_metrics
from dyngen.store.names import validate_name
from dyngen.trainers.inbox_queue import Flushed, InboxQueue, retryable

RUN_ENV = "DYNGEN_RUN"
DEFAULT_RUN = "default"
STORE_WAIT_SECONDS = 2.0  # the longest an emit waits for the store
QUEUE_FLUSH_SECONDS = 1.0  # of it, spent writing batch ends queued before

Status = Literal["written", "kept", "queued", "unrecorded"]
logger = logging.getLogger(__name__)

_unnamed_said = False
_store_down: set[str] = set()  # roots this process said are unreachable (once per outage)
_said: set[tuple[str, ...]] = set()  # other things said once per process
_writing: dict[str, threading.Thread] = {}  # a store's write still running, by root
_stores: dict[str, Any] = {}  # Store objects opened from a root or settings


@dataclass(frozen=True)
class Recorded:
    """What became of a batch end in the store: written, kept (a re-send: the first entry
    stays), queued locally, or unrecorded (see the log)."""

    status: Status
    event_id: str  # the entry's (the first one's, when kept)
    run: str | None = None  # the run it is under; None when unrecorded
    metrics: dict[str, float] = field(default_factory=dict)  # as recorded
    reason: str = ""  # why it was queued or unrecorded


def training_run(run: str | None = None) -> str:
    """The training run's id: `run`, else $DYNGEN_RUN, else DEFAULT_RUN (said once)."""
    global _unnamed_said
    if run is not None:
        return run
    named = os.environ.get(RUN_ENV)
    if named:
        return named
    if not _unnamed_said:
        _unnamed_said = True
        logger.info("dyngen: batch ends are recorded under the training run %r (no run named, "
                    "%s unset). A resumed run and a new run can only be told apart by naming "
                    "the run: a new run under the same name lands nothing for the steps an "
                    "earlier one sent. Pass run=... or set %s.", DEFAULT_RUN, RUN_ENV, RUN_ENV)
    return DEFAULT_RUN


def open_store(store: Any) -> Any:
    """A Store: the one given, or one opened from a root or a store config mapping (kept,
    so a trainer opens its store once)."""
    if hasattr(store, "write_batch_end"):
        return store
    from dyngen.store import Store
    from dyngen.store.location import store_settings

    settings = store_settings(store)
    key = repr(sorted(settings.items()))
    if key not in _stores:
        _stores[key] = Store.from_config(settings)
    return _stores[key]


def store_metrics(metrics: Any) -> tuple[dict[str, float], list[str]]:
    """The metrics the store takes, as floats, and `name=value` of each it would refuse.

    One rule for every trainer path: the store's own check (`check_metrics`), applied to
    each metric alone, so one it refuses is left out instead of refusing the batch end;
    past MAX_METRICS the rest are left out too. Never raises."""
    if metrics is None:
        return {}, []
    if not isinstance(metrics, Mapping):
        return {}, [f"metrics={_shown(metrics)} (not a mapping of names to numbers)"]
    kept: dict[str, float] = {}
    left_out = []
    for name, value in metrics.items():
        try:
            one = check_metrics({name: value})
        except Exception:  # BatchEndError, or a number whose float() fails its own way
            label = name[:MAX_TEXT] if isinstance(name, str) else _shown(name)
            left_out.append(f"{label}={_shown(value)}")
            continue
        if len(kept) >= MAX_METRICS:
            left_out.append(f"{name} (past the first {MAX_METRICS})")
            continue
        kept.update(one)
    return kept, left_out


def clean_metrics(metrics: Any, dataset: str, step: int) -> dict[str, float]:
    """`store_metrics`, saying which are left out (once per dataset and names)."""
    kept, left_out = store_metrics(metrics)
    if left_out and _once("metrics", str(dataset), *sorted(m.split("=")[0] for m in left_out)):
        logger.warning("dyngen: batch end of %r step %s: metric(s) %s are not what the store "
                       "takes (a name of 1-%d characters, a finite number; at most %d); they "
                       "are left out of it (and of later batch ends, said once). Log them as "
                       "numbers, or leave them out.", dataset, step, ", ".join(left_out),
                       MAX_TEXT, MAX_METRICS)
    return kept


def _shown(value: Any) -> str:
    """A short repr, even of a value whose repr fails (an int too long to print)."""
    try:
        return repr(value)[:60]
    except Exception:
        return f"<{type(value).__name__}>"


def record_batch_end(store: Any, dataset: str, run: str | None, step: int,
                     metrics: Mapping[str, Any] | None, rollouts: Any,
                     event_id: str) -> Recorded:
    """Write a batch end into the store's inbox, or queue it locally; never raises."""
    try:
        run = check_run(training_run(run))
        dataset, step = validate_name(dataset), check_step(step)
        clean = clean_metrics(metrics, dataset, step)
        target = open_store(store)
    except Exception as exc:
        return _unrecorded(dataset, step, event_id, exc)
    root = str(target.root)
    queue = InboxQueue()
    running = _writing.get(root)
    if running is not None and running.is_alive():
        return _queue(queue, root, dataset, run, step, clean, rollouts, event_id,
                      "the store is still answering an earlier write")
    outcome: dict[str, Any] = {}

    def write() -> None:
        try:
            flushed = queue.flush(target, budget_seconds=QUEUE_FLUSH_SECONDS)
            outcome["flushed"] = flushed
            if flushed.pending:  # queued ones go first: this one waits behind them
                outcome["behind"] = flushed.reason
                return
            outcome["entry"] = target.write_batch_end(dataset, run, step, clean, rollouts,
                                                      event_id=event_id)
        except BaseException as exc:  # handed to the trainer's thread, which decides
            outcome["error"] = exc

    worker = threading.Thread(target=write, name="dyngen-inbox-write", daemon=True)
    _writing[root] = worker
    worker.start()
    worker.join(STORE_WAIT_SECONDS)
    if worker.is_alive():
        return _queue(queue, root, dataset, run, step, clean, rollouts, event_id,
                      f"the store did not answer within {STORE_WAIT_SECONDS:g} s")
    flushed = outcome.get("flushed")
    if "error" in outcome:
        exc = outcome["error"]
        if not retryable(exc):
            return _unrecorded(dataset, step, event_id, exc)
        return _queue(queue, root, dataset, run, step, clean, rollouts, event_id,
                      f"{type(exc).__name__}: {exc}")
    if "behind" in outcome:
        return _queue(queue, root, dataset, run, step, clean, rollouts, event_id,
                      f"batch ends queued before it are not all written ({outcome['behind']})")
    _reachable(root, flushed.written if flushed is not None else 0)
    entry = outcome["entry"]
    if entry.created:
        return Recorded("written", entry.event_id, run, dict(entry.metrics))
    if entry.differs and _once("differs", dataset, run):
        logger.warning(
            "dyngen: %r run %r step %d already has a batch end in the store, with other %s; "
            "the first is kept and this one writes nothing. A resumed run re-sending its "
            "steps is expected to; a new run needs a name of its own (run=..., %s).",
            dataset, run, step, " and ".join(entry.differs), RUN_ENV)
    return Recorded("kept", entry.event_id, run, dict(entry.metrics))


def _queue(queue: InboxQueue, root: str, dataset: str, run: str, step: int,
           metrics: dict[str, float], rollouts: Any, event_id: str, why: str) -> Recorded:
    """Keep the batch end in the local retry queue (said once per outage)."""
    try:
        kept = queue.put(root, dataset, run, step, metrics, rollouts, event_id)
    except Exception as exc:
        return _unrecorded(dataset, step, event_id, exc)
    if kept is None:
        return Recorded("unrecorded", event_id, None, metrics, "the local retry queue is full")
    if root not in _store_down:
        _store_down.add(root)
        logger.warning("dyngen: batch end of %r run %r step %d was not written to the store "
                       "%s: %s. Training continues; it waits in %s and is written, in order, "
                       "once the store takes it (the next batch end, or `dyngen emit --flush`)",
                       dataset, run, step, root, why, queue.folder(root))
    else:
        logger.debug("dyngen: batch end of %r step %d queued: %s", dataset, step, why)
    return Recorded("queued", event_id, run, metrics, why)


def _reachable(root: str, written: int) -> None:
    if root in _store_down:
        _store_down.discard(root)
        logger.warning("dyngen: the store %s is reachable again; batch ends are written to it "
                       "again (%d from the local retry queue)", root, written)


def _unrecorded(dataset: Any, step: Any, event_id: str, exc: BaseException) -> Recorded:
    """A batch end the store cannot hold: said, never raised; the event still goes."""
    logger.warning("dyngen: batch end of %r step %s is not recorded in the store: %s: %s. "
                   "Training continues; its event is sent without it.", dataset, step,
                   type(exc).__name__, exc)
    return Recorded("unrecorded", event_id, None, {}, f"{type(exc).__name__}: {exc}")


def _once(*key: str) -> bool:
    """True the first time `key` is seen in this process."""
    if key in _said:
        return False
    _said.add(key)
    return True


def flush_queues(store: Any = None) -> Flushed:
    """Write every batch end waiting in the local retry queue into its store, in order
    (`store`: the Store to use for its own root, e.g. one with storage options; other
    roots are opened by their root alone). Stops, per store, at the first it cannot take."""
    queue, written, pending, reasons = InboxQueue(), 0, 0, []
    mine = str(open_store(store).root) if store is not None else None
    for root in queue.roots():
        if not queue.pending(root):
            continue
        try:
            target = open_store(store) if mine == root else open_store(root)
            done = queue.flush(target)
        except Exception as exc:
            done = Flushed(0, len(queue.pending(root)), f"{type(exc).__name__}: {exc}")
        written, pending = written + done.written, pending + done.pending
        if done.reason:
            reasons.append(f"{root}: {done.reason}")
        elif root in _store_down:
            _reachable(root, done.written)
    return Flushed(written, pending, "; ".join(reasons))
