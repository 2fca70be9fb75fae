"""The trainer-side dataset: a map-style view of a dataset's newest committed version.

`DyngenDataset` is framework-neutral (anything that indexes rows and calls `len` can use
it, a `torch.utils.data.DataLoader` included). Rows are the stored rows, verl's RL schema
plus the provenance columns `_dyngen_version`, `_dyngen_round` and `_dyngen_generator`.
Reading never copies old rows: shards are memory-mapped, and a newer version shares the
shard files of its parent. After each training batch `on_batch_end` writes the batch end
into the dataset's inbox in the store (as its training run's step), asks for a generation
round (a Prefect event, or the round inline) and maps whatever version is committed.
"""

from __future__ import annotations

import importlib
import logging
import os
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Literal

import datasets

from dyngen.config import round_params
from dyngen.config.preflight import check_before_start
from dyngen.errors import (
    ConfigError,
    DyngenError,
    DyngenImportError,
    GeneratorClassNotFoundError,
    GeneratorError,
    GeneratorNotFoundError,
    GeneratorTypeError,
)
from dyngen.filters.chain import check_prompt_key
from dyngen.server.local import ensure_prefect_api
from dyngen.store import Store, VersionRecord
from dyngen.trainers.events import batch_end_payload, emit_batch_end, send_batch_end
from dyngen.trainers.inbox_write import record_batch_end

Mode = Literal["emit", "inline"]
# Runs one round: (dataset, config=plain config, trigger=plain trigger) → the round's summary.
RoundRunner = Callable[..., dict[str, Any]]
# The round run in this process (a Prefect flow run). Named, not imported: the core never
# imports the Prefect layer; an inline dataset reaches it only when it runs a round.
DEFAULT_ROUND_RUNNER = "dyngen.runtime.in_process:run_round"
MODES: tuple[str, ...] = ("emit", "inline")
# Event ids of start rounds: one per dataset and head, whichever process asks first.
_START_NAMESPACE = uuid.UUID("5d0f0c62-3d43-4c1e-9f59-0b4b0e8f6a51")
_START_POLL_SECONDS = 0.5
# What stops an inline trainer: a round that cannot start fails alike at every batch end, so
# logging it would let training run on with a dataset that never grows. A round that fails
# while running (the generator's own exception, a model server down) is only logged.
CANNOT_START: tuple[type[BaseException], ...] = (
    ConfigError, ImportError, GeneratorNotFoundError, GeneratorClassNotFoundError,
    GeneratorTypeError)

logger = logging.getLogger(__name__)


class DyngenDataset:
    """Rows of the newest committed version of `dataset`, growing as rounds commit.

    `run` names the training run whose batch ends `on_batch_end` records (default:
    $DYNGEN_RUN, else "default"): a resumed run keeps its name, and its re-sent steps land
    nothing twice; a new run needs a new one.
    """

    def __init__(self, store_root: str | os.PathLike[str], dataset: str, *, mode: Mode = "emit",
                 config: Mapping[str, Any] | None = None, every_n_batches: int = 1,
                 metrics_fn: Callable[[Any], Mapping[str, float]] | None = None,
                 round_runner: RoundRunner | None = None, generate_on_start: bool = False,
                 start_timeout: float = 600.0, run: str | None = None) -> None:
        if mode not in MODES:
            raise ConfigError(f"mode: expected one of {', '.join(MODES)}, found {mode!r}. "
                              "Use 'emit' (a Prefect server runs rounds) or 'inline'.")
        if isinstance(every_n_batches, bool) or not isinstance(every_n_batches, int) \
                or every_n_batches < 1:
            raise ConfigError(f"every_n_batches: expected an integer >= 1, found "
                              f"{every_n_batches!r}. Set it to 1 for a round after every batch.")
        # How to reach a URL root (storage_options, cache_dir) comes from the config's store.
        section = config.get("store") if isinstance(config, Mapping) else None
        self.store = Store.from_config({**dict(section or {}), "root": os.fspath(store_root)})
        self.name = dataset
        self.run = run
        self.mode: Mode = mode
        self.every_n_batches = every_n_batches
        self.metrics_fn = metrics_fn
        self.round_runner = round_runner
        self.batches = 0
        # Inline rounds need a valid config, a loadable generator and the round's modules
        # now, not a failing round at every batch later.
        self.round_config = (round_params(config, root=self.store.root) if mode == "inline"
                             else None)
        if self.round_config is not None:
            check_before_start(self.round_config)
            self.round_runner = round_runner or default_round_runner()
        if not isinstance(generate_on_start, bool):
            raise ConfigError(f"generate_on_start: expected true or false, found "
                              f"{generate_on_start!r}.")
        if isinstance(start_timeout, bool) or not isinstance(start_timeout, (int, float)) \
                or not start_timeout > 0:
            raise ConfigError(f"start_timeout: expected seconds > 0, found {start_timeout!r}. "
                              "It bounds the wait for the start round's version (emit mode).")
        self._record: VersionRecord = self.store.head(dataset)
        if self.round_config is not None:
            check_prompt_key(self.round_config["data"]["prompt_key"], self._record, dataset)
        # What the start round returned (event id or summary); None if none was asked for.
        self.start_round: str | dict[str, Any] | None = None
        if generate_on_start:
            self.start_round = self._generate_on_start(float(start_timeout))
            self._record = self.store.head(dataset)
        self._data: datasets.Dataset = self.store.load(dataset, self._record.version)

    # ---- reading ---------------------------------------------------------------------
    @property
    def version(self) -> int:
        """The committed version whose rows this dataset serves."""
        return self._record.version

    @property
    def record(self) -> VersionRecord:
        """The version record of the rows served."""
        return self._record

    @property
    def data(self) -> datasets.Dataset:
        """The rows served, as a memory-mapped `datasets.Dataset`."""
        return self._data

    def __len__(self) -> int:
        """Number of rows in the version served."""
        return len(self._data)

    def __getitem__(self, index: int) -> dict[str, Any]:
        """One stored row (verl's schema plus the `_dyngen_*` provenance columns)."""
        return self._data[index]

    def refresh(self) -> bool:
        """Map the newest committed version if it is newer; tell whether one was mapped.

        Shards this process opened before are not opened again: the cost is the new
        shards (a round's, or a compaction's), not the whole dataset.
        """
        head = self.store.head_version(self.name)
        if head is None or head == self._record.version:
            return False
        record = self.store.record(self.name, head)
        self._data = self.store.load(self.name, head)  # memory-mapped again: no row is copied
        self._record = record
        return True

    def rows_added_since(self, version: int) -> datasets.Dataset | None:
        """Rows the served version appends to `version`, or None if it does not extend it.

        Appends add rows at the end, and compaction and retention keep rows and their
        order; a restore, for one, yields a version that is not `version` plus new rows.
        """
        old = self.store.record(self.name, version)
        if not self.store.extends(self.name, version, self._record.version):
            return None
        if old.rows >= len(self._data):
            return self._data.select(range(0))  # datasets rejects range(n, n)
        return self._data.select(range(old.rows, len(self._data)))  # contiguous: no copy

    # ---- growing ---------------------------------------------------------------------
    def on_batch_end(self, batch: Any = None, *, step: int | None = None,
                     metrics: Mapping[str, float] | None = None, rollouts: Any = None,
                     event_id: str | None = None,
                     run: str | None = None) -> str | dict[str, Any] | None:
        """Count a finished training batch; every N batches record it and ask for a round;
        then refresh.

        The batch end is first written into the dataset's inbox in the store, as step
        `step` of training run `run` (default: the dataset's `run`), with its metrics and
        rollouts (a JSONL file's path, or a list of JSON values); a store that cannot be
        reached keeps it in a local retry queue. Returns the event id (emit mode), the
        round's summary (inline mode), or None when this batch asks for nothing or the
        request failed. A failed request is logged and training goes on; only an inline
        round that cannot start (an invalid config, a generator or module that cannot be
        loaded) raises, as it would fail at every batch. `step` defaults to the number of
        batches seen; `metrics` to `metrics_fn(batch)` when a `metrics_fn` was given;
        `event_id` (the round's idempotency key) to a new UUID.
        """
        self.batches += 1
        step = self.batches if step is None else int(step)
        run = self.run if run is None else run
        result: str | dict[str, Any] | None = None
        if self.batches % self.every_n_batches == 0:
            if metrics is None and self.metrics_fn is not None:
                metrics = self._metrics_of(batch, step)
            if self.mode == "emit":
                result = emit_batch_end(self.name, step, metrics, rollouts, event_id=event_id,
                                        store=self.store, run=run)
            else:
                result = self._run_inline(step, metrics, rollouts, event_id, run)
        try:
            self.refresh()
        except Exception as exc:  # a half-visible store must not stop training
            logger.warning("dyngen: could not map the newest version of %r (%s); still "
                           "serving version %d", self.name, exc, self.version)
        return result

    def _generate_on_start(self, timeout: float) -> str | dict[str, Any] | None:
        """One round before the first batch, unless a round already committed by the head.

        The round's event id comes from the dataset and its head, so every process that
        starts on that head (ranks, a restart before it lands) asks for the same round,
        which commits once. Inline: run it here. Emit: send it and wait for its version
        up to `timeout` seconds (a queued event is not waited for).
        """
        state = self.store.state(self.name)
        if state.generators:
            logger.info("dyngen: %r already has rounds (newest: version %d); no start round",
                        self.name, max(state.generators.values()))
            return None
        event_id = start_event_id(self.name, self._record)
        if self.store.find_idempotency_key(self.name, f"event:{event_id}") is not None:
            return event_id
        if self.mode == "inline":  # a start round ends no training batch: nothing to record
            return self._run_inline(0, None, None, event_id, record=False)
        delivery = send_batch_end(self.name, 0, event_id=event_id)
        if delivery.status != "sent":
            logger.warning("dyngen: the start round of %r was %s, not sent; training starts "
                           "on version %d", self.name, delivery.status, self.version)
            return None if delivery.status == "dropped" else event_id
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.store.find_idempotency_key(self.name, f"event:{event_id}") is not None:
                return event_id
            time.sleep(_START_POLL_SECONDS)
        logger.warning("dyngen: the start round of %r (event %s) did not commit within %.0f s; "
                       "training starts on version %d and maps the round when it lands",
                       self.name, event_id, timeout, self.version)
        return event_id

    def _metrics_of(self, batch: Any, step: int) -> Mapping[str, float] | None:
        try:
            return self.metrics_fn(batch) if self.metrics_fn is not None else None
        except Exception as exc:
            logger.warning("dyngen: metrics_fn failed at step %s (%s: %s); the round is "
                           "asked for without metrics", step, type(exc).__name__, exc)
            return None

    def _run_inline(self, step: int, metrics: Mapping[str, float] | None,
                    rollouts: Any, event_id: str | None = None, run: str | None = None,
                    record: bool = True) -> dict[str, Any] | None:
        """Run the round here: for the batch end recorded in the store first (`record`)."""
        event_id, named = event_id or str(uuid.uuid4()), None
        if record:
            recorded = record_batch_end(self.store, self.name, run, step, metrics, rollouts,
                                        event_id)
            event_id, named = recorded.event_id, recorded.run
            if recorded.status != "unrecorded":
                metrics = recorded.metrics
        if not isinstance(rollouts, (str, os.PathLike)):
            rollouts = None  # rows travel in the store only; a trigger names a file
        trigger = batch_end_payload(step, metrics, rollouts, event_id, run=named)["trigger"]
        try:
            ensure_prefect_api()  # without PREFECT_API_URL: a temporary server, started once
            runner = self.round_runner or default_round_runner()
            return runner(self.name, config=self.round_config, trigger=trigger)
        except Exception as exc:
            if not cannot_start(exc):
                logger.exception("dyngen: the inline generation round of %r at step %s "
                                 "failed; training continues on version %d", self.name, step,
                                 self.version)
                return None
            if isinstance(exc, DyngenError):
                raise  # already dyngen's one-line message
            raise _import_failed(exc, f"the inline generation round of {self.name!r} at "
                                      f"step {step}") from exc


def start_event_id(dataset: str, head: VersionRecord) -> str:
    """The event id of `dataset`'s start round on `head`: the same in every process."""
    return str(uuid.uuid5(_START_NAMESPACE, f"{dataset}:{head.version}:{head.created_at}"))


def default_round_runner() -> RoundRunner:
    """The function `DEFAULT_ROUND_RUNNER` names (flows' in-process round).

    Raises `DyngenImportError` when that module (or one it imports) fails to import.
    """
    module, _, name = DEFAULT_ROUND_RUNNER.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as exc:
        raise _import_failed(exc, "an inline generation round") from exc


def cannot_start(exc: BaseException) -> bool:
    """Whether a round's error is one every later round would meet too (no retry fixes it)."""
    return isinstance(exc, CANNOT_START) or type(exc) is GeneratorError  # data.datagen unset


def _import_failed(exc: ImportError, where: str) -> DyngenImportError:
    """dyngen's one-line error for a module a round needs that failed to import."""
    return DyngenImportError(
        f"{where} cannot start: {type(exc).__name__}: {exc}. A module of the same name in the "
        "working folder or on PYTHONPATH may shadow the one needed; fix or rename it, or "
        "install what is missing, then start training again.")
