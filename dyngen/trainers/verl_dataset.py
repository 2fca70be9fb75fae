"""verl drop-in: an `RLHFDataset` whose rows come from the dyngen store, growing as it trains.

Name it in verl's config (this module imports verl; `import dyngen` never does)::

    data.custom_cls.path=pkg://dyngen.verl_dataset
    data.custom_cls.name=VerlDyngenDataset
    +data.dyngen.dataset=gsm8k-dyn          # required: the store dataset
    +data.dyngen.root=/abs/path/dyngen_store  # default: $DYNGEN_STORE_ROOT or dyngen_store
    +data.dyngen.mode=emit                   # emit (a Prefect server runs rounds) | inline
    +data.dyngen.every_n_batches=1
    +data.dyngen.config={...}                # inline mode: the round's dyngen config
    +data.dyngen.generate_on_start=true      # one round before the first batch (default false)
    +data.dyngen.start_timeout=600           # emit mode: seconds to wait for that round
    +data.dyngen.run=my-run                  # the training run (default: trainer.experiment_name)
    +data.dyngen.sampler=frontier            # draw by each row's difficulty record
                                             # (default fresh_first: verl's own order)

Each batch end goes into the dataset's inbox in the store as a step of the training run
`data.dyngen.run` (default: verl's `trainer.experiment_name`, else $DYNGEN_RUN): a run
resumed under its name lands none of its re-sent steps twice, and a new run needs a new
name. The first run imports `data.train_files` as version 0; every later run resumes from the
newest committed version, generated rows included, and does not re-read the files.
verl 0.9.1 calls `train_dataset.on_batch_end(batch=batch)` only in its legacy trainer
(`trainer.use_v1=false`, `RayPPOTrainer.fit`) and in the experimental separation trainer;
its default V1 trainer never does, so there rows grow only from one start to the next.
verl builds the validation set with the same class; it is verl's plain `RLHFDataset` over
its files (never grown), `data.val_files` equal to `data.train_files` included.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import datasets
import numpy as np
from omegaconf import DictConfig, OmegaConf
from verl.utils.dataset.rl_dataset import RLHFDataset

from dyngen.difficulty.frontier import frontier_weights, weighted_slots
from dyngen.difficulty.record import DifficultyBook
from dyngen.errors import DatasetExistsError
from dyngen.round.top_up import ROWS_WANTED
from dyngen.store import Store
from dyngen.store.keys import prompt_keys
from dyngen.trainers.dataset import DyngenDataset
from dyngen.trainers.verl_files import batch_metrics, global_step, resumed_state
from dyngen.trainers.verl_format import import_files
from dyngen.trainers.verl_settings import is_train, round_config, settings_of

logger = logging.getLogger(__name__)

# Marks this dataset's state inside the dataloader's checkpoint.
STATE_KEY = "dyngen_dataset"


class VerlDyngenDataset(RLHFDataset):
    """verl's `RLHFDataset` over the newest committed version of a dyngen dataset.

    `__getitem__`, `collate_fn`, the sampler and the over-long prompt filter are verl's;
    only where rows come from differs. Rows keep the `_dyngen_*` provenance columns, so
    they reach the batch's `non_tensor_batch`.

    Growth: `on_batch_end` appends newly committed rows at the end (every index the running
    epoch drew stays valid); verl's samplers read `len(dataset)` when an epoch starts (and
    workers are forked per epoch), so new rows are drawn from the next epoch on.
    Resume: `state_dict()` (in verl's `data.pt`) names the version and row count the running
    epoch samples from and the step it began at (epochs end where `on_batch_end`'s steps say).
    Resuming mid-epoch, the dataset is built on that version (verl's checkpoint found as verl
    finds it), so the sampler replays the epoch on the same rows in the same order.
    """

    # Class-level defaults: an instance made without __init__ (verl's own tests build one with
    # `__new__` and set only what a method reads) behaves as verl's RLHFDataset.
    dyngen_settings: dict[str, Any] | None = None
    source: DyngenDataset | None = None
    _version: int | None = None
    _unapplied: int | None = None
    _epoch: dict[str, Any] | None = None  # the running epoch: version, rows, first_step
    _resume: tuple[int, dict[str, Any]] | None = None  # (checkpoint step, dataset state)
    _tracked = False  # whether epochs were followed (verl called on_batch_end)
    _slots: np.ndarray | None = None  # the frontier sampler's row for each index
    _book: DifficultyBook | None = None  # the difficulty record, as of the version served
    _keys: np.ndarray | None = None  # the prompt keys of the rows weighed so far, in order

    def __init__(self, data_files: str | list[str], tokenizer: Any, config: DictConfig,
                 processor: Any = None, max_samples: int = -1) -> None:
        self.dyngen_settings = settings_of(config) if is_train(data_files, config) else None
        self.source = None
        self._resume = None if self.dyngen_settings is None else \
            _resume_point(config, self.dyngen_settings["dataset"])
        super().__init__(data_files=data_files, tokenizer=tokenizer, config=config,
                         processor=processor, max_samples=max_samples)

    # ---- where rows come from (verl's hooks) ----------------------------------------
    def _download(self, use_origin_parquet: bool = False) -> None:
        """Seed the store from `data_files` if the dataset has no version yet; else skip."""
        if self.dyngen_settings is None:
            return super()._download(use_origin_parquet)
        store, name = Store(self.dyngen_settings["root"]), self.dyngen_settings["dataset"]
        head = store.head_version(name)
        if head is not None:
            logger.info("dyngen: %r resumes from version %d under %s; data_files are not "
                        "read", name, head, store.root)
            return None
        super()._download(use_origin_parquet)  # verl's copy of remote files to local ones
        try:
            record = import_files(store, name, list(self.data_files), prompt_key=self.prompt_key,
                                  as_verl=True)
            logger.info("dyngen: seeded %r version 0 with %d rows from %s", name,
                        record.rows, list(self.data_files))
        except DatasetExistsError:  # another process seeded it first: use theirs
            pass
        return None

    def _read_files_and_tokenize(self) -> None:
        """Map the newest committed version, then apply verl's max_samples and filter."""
        if self.dyngen_settings is None:
            return super()._read_files_and_tokenize()
        if self.source is None:
            cfg = self.dyngen_settings
            self.source = DyngenDataset(
                cfg["root"], cfg["dataset"], mode=cfg["mode"],
                every_n_batches=cfg["every_n_batches"],
                generate_on_start=cfg["generate_on_start"], start_timeout=cfg["start_timeout"],
                run=cfg["run"], config=round_config(cfg, self.config, self.tokenizer)
                if cfg["mode"] == "inline" else None)
        else:
            self.source.refresh()
        version, first_step = self._start()
        store, name = self.source.store, self.source.name
        frame = self.source.data if version == self.source.version else store.load(name, version)
        logger.info("dyngen: %r version %d has %d rows", name, version, len(frame))
        self.dataframe = self.maybe_filter_out_long_prompts(self._max_samples(frame, version))
        self._version, self._keys = version, None  # rows read afresh: keyed afresh
        self._epoch = {"version": version, "rows": len(self.dataframe), "first_step": first_step}
        self._reweigh()
        return None

    def _start(self) -> tuple[int, int]:
        """The version to serve and the step the running epoch began at: the checkpoint's
        epoch if verl resumes in the middle of one, else the newest version."""
        assert self.source is not None
        if self._resume is None:
            return self.source.version, 1
        step, state = self._resume
        self._resume, self._tracked = None, bool(state.get("tracked"))
        size, done = self._batch_size(), step - int(state["first_step"]) + 1
        if not self._tracked or not size or done % max(int(state["rows"]) // size, 1) == 0:
            return self.source.version, step + 1  # the epoch ended: the next one is on the head
        logger.info("dyngen: verl resumes at step %d in an epoch on version %d of %r: serving "
                    "it until the epoch ends", step, state["version"], self.source.name)
        return int(state["version"]), int(state["first_step"])

    def _max_samples(self, frame: datasets.Dataset, version: int) -> datasets.Dataset:
        """verl's `max_samples` selection over the imported rows (version 0), the same at
        every start; rows later rounds added are all kept."""
        if self.max_samples <= 0:
            return frame
        assert self.source is not None
        store, name = self.source.store, self.source.name
        base = store.record(name, 0).rows if store.extends(name, 0, version) else len(frame)
        if self.max_samples >= base:
            return frame
        if self.shuffle:  # verl's own selection, as in RLHFDataset
            rng = np.random.default_rng(*((self.seed,) if self.seed is not None else ()))
            picked = rng.choice(base, size=self.max_samples, replace=False).tolist()
        else:
            picked = list(range(self.max_samples))
        return frame.select([*picked, *range(base, len(frame))])

    def _batch_size(self) -> int:
        """The training dataloader's batch size, as verl sets it (drop_last=True)."""
        size = self.config.get("gen_batch_size") or self.config.get("train_batch_size")
        return size if isinstance(size, int) and size > 0 else 0

    # ---- checkpoints (torchdata's Stateful protocol) -----------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What verl's checkpoint keeps: the version the running epoch samples from."""
        if self.source is None or self._epoch is None:
            return {}
        return {STATE_KEY: self.source.name, **self._epoch, "tracked": self._tracked,
                "served": self._version}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Check the dataloader's restored state against the rows this dataset was built on."""
        if self.source is None or self._epoch is None or state.get(STATE_KEY) != self.source.name:
            return
        if state.get("tracked") and self._epoch["first_step"] > state["first_step"]:
            return  # the saved epoch had ended: this one started after it, on the head
        if (state["version"], state["rows"]) != (self._epoch["version"], self._epoch["rows"]):
            logger.warning(
                "dyngen: the checkpoint's epoch samples version %s of %r (%s rows), this "
                "dataset serves version %s (%s rows): the rest of the epoch is not the "
                "interrupted one's order", state["version"], self.source.name, state["rows"],
                self._epoch["version"], self._epoch["rows"])
            return
        self._epoch = {k: state[k] for k in ("version", "rows", "first_step")}
        self._tracked = bool(state.get("tracked"))

    def _batch_ended(self, step: int | None) -> None:
        """Follow verl's epochs: after an epoch's last batch the next one samples all rows."""
        epoch, size = self._epoch, self._batch_size()
        if epoch is None or not size:
            return
        self._tracked = True
        done = epoch.setdefault("done", 0) + 1 if step is None else step - epoch["first_step"] + 1
        epoch["done"] = done
        if done >= epoch["rows"] // size:
            after = step + 1 if step is not None else epoch["first_step"] + done
            self._epoch = {"version": self._version, "rows": len(self.dataframe),
                           "first_step": after}

    def maybe_filter_out_long_prompts(self, dataframe: datasets.Dataset | None = None
                                      ) -> datasets.Dataset:
        """verl's over-long prompt filter, writing no index file beside the store's shards.

        With one filter worker (verl's default) verl's predicate runs in this process;
        with more, verl's own `datasets.filter` runs with caching sent to a temp dir.
        """
        if self.source is None or dataframe is None or not self.filter_overlong_prompts:
            return super().maybe_filter_out_long_prompts(dataframe)
        if (self.num_workers or 1) <= 1:
            return self._filter_in_process(dataframe)
        with _caching_outside_store():
            return super().maybe_filter_out_long_prompts(dataframe)

    def _filter_in_process(self, rows: datasets.Dataset) -> datasets.Dataset:
        kept = super().maybe_filter_out_long_prompts(_RowsForFilter(rows))
        return kept.rows if isinstance(kept, _RowsForFilter) else kept

    # ---- growing --------------------------------------------------------------------
    @property
    def version(self) -> int | None:
        """The dataset version whose rows verl sees (None for a validation set)."""
        return self._version

    def refresh(self) -> bool:
        """Append the rows of a newer committed version; tell whether rows were added."""
        if self.source is None or self._version is None:
            return False
        self.source.refresh()
        if self.source.version == self._version:
            return False
        added = self.source.rows_added_since(self._version)
        if added is None:
            if self._unapplied != self.source.version:
                logger.warning("dyngen: version %d of %r does not extend version %d (a "
                               "restore?); training keeps version %d until the trainer "
                               "restarts", self.source.version, self.source.name,
                               self._version, self._version)
                self._unapplied = self.source.version
            return False
        # A round's few rows: filtered here, not in worker processes.
        kept = self._filter_in_process(added) if self.filter_overlong_prompts else added
        if len(kept):
            self.dataframe = datasets.concatenate_datasets([self.dataframe, kept])
        self._version = self.source.version
        self._reweigh()
        return True

    # ---- the frontier sampler (data.dyngen.sampler: frontier) ------------------------
    def __getitem__(self, item: int) -> dict[str, Any]:
        """verl's row `item`; with the frontier sampler, the row drawn into that index."""
        slots = self._slots
        return super().__getitem__(int(slots[item]) if slots is not None and
                                   0 <= item < len(slots) else item)

    def _reweigh(self) -> None:
        """With the frontier sampler: which row fills each index verl's sampler visits,
        drawn by each row's difficulty record at the served version, seeded by (seed,
        version); every index its own row while nothing is measured."""
        sampler = (self.dyngen_settings or {}).get("sampler")
        if sampler is None or self.source is None or self._version is None:
            return
        book = self._book
        if book is None or book.version > self._version:
            book = DifficultyBook.at(self.source.store, self.source.name, self._version)
        else:  # the versions since the last one weighed
            book.advance(self.source.store, self.source.name, self._version)
        self._book = book
        keys, rows = self._keys, len(self.dataframe)
        if keys is None or len(keys) > rows:
            keys = np.zeros(0, dtype=np.uint64)
        if len(keys) < rows:  # rows only ever join at the end: key the new ones
            added = self.dataframe.select(range(len(keys), rows))[self.prompt_key]
            keys = np.concatenate([keys, prompt_keys(list(added))])
        self._keys = keys
        seed = [int(self.dyngen_settings["seed"]), self._version]
        self._slots = weighted_slots(frontier_weights(book, keys, sampler), seed)
        if self._slots is None:
            logger.warning("dyngen: frontier sampler of %r: no row of version %d has a recent "
                           "measurement; verl's own order until a round records some",
                           self.source.name, self._version)

    def metrics_from_batch(self, batch: Any) -> dict[str, float]:
        """The round's trigger metrics from a verl `DataProto` (see `batch_metrics`)."""
        return batch_metrics(batch)

    def on_batch_end(self, batch: Any = None) -> str | dict[str, Any] | None:
        """verl's hook after a training batch: ask for a round, then append new rows.

        The metrics state `dyngen/rows_wanted`, the prompts verl draws before the next
        round (its batch size × every_n_batches), so a round short of them asks its
        generator again (round.top_up). Returns the event id (emit), the round's summary
        (inline) or None. Raises only where
        an inline round cannot start (see `DyngenDataset.on_batch_end`): verl's trainer stops
        with dyngen's message rather than training on a dataset that never grows.
        """
        if self.source is None:
            return None
        try:
            metrics: Mapping[str, float] | None = self.metrics_from_batch(batch)
        except Exception as exc:
            logger.warning("dyngen: no metrics from the batch (%s: %s)", type(exc).__name__, exc)
            metrics = None
        if (size := self._batch_size()) and metrics is not None:  # prompts before next round
            metrics = {**metrics, ROWS_WANTED: float(size * self.source.every_n_batches)}
        step = global_step(batch)
        try:
            result = self.source.on_batch_end(batch, step=step, metrics=metrics)
            try:
                self.refresh()
            except Exception as exc:
                logger.warning("dyngen: new rows of %r not added (%s: %s); training goes on "
                               "with version %s", self.source.name, type(exc).__name__, exc,
                               self._version)
        finally:
            self._batch_ended(step)
        return result


class _RowsForFilter:
    """Stands in for a `datasets.Dataset` in verl's filter, applying its predicate row by row.

    verl calls `dataframe.filter(predicate, num_proc=..., desc=...)`; `datasets` would first
    hash the predicate, whose closure holds the tokenizer: seconds for every new version.
    """

    def __init__(self, rows: datasets.Dataset) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def filter(self, predicate: Callable[[dict[str, Any]], bool], **_: Any) -> datasets.Dataset:
        """The rows the predicate keeps (an index mapping held in memory, no copy)."""
        return self.rows.select([i for i, row in enumerate(self.rows) if predicate(row)])


def _resume_point(config: Any, name: str) -> tuple[int, dict[str, Any]] | None:
    """The checkpoint verl's trainer will resume from, and this dataset's state in it."""
    try:
        trainer = OmegaConf.select(config._get_root(), "trainer")
    except Exception:  # a plain dict, or a section verl passed on its own
        return None
    found = resumed_state(trainer, STATE_KEY, name) if trainer is not None else None
    if found is not None and trainer.get("use_v1") is False:  # the legacy trainer's fit loop
        found[1]["tracked"] = True  # calls on_batch_end after every batch: epochs are followed
    return found


@contextmanager
def _caching_outside_store() -> Iterator[None]:
    """Write `datasets` index files to a temp dir, never beside the store's shards."""
    enabled = datasets.is_caching_enabled()
    datasets.disable_caching()
    try:
        yield
    finally:
        if enabled:
            datasets.enable_caching()
