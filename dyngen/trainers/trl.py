"""Hugging Face TRL (and any `transformers.Trainer`): a callback and a growing dataset.

- `DyngenCallback` asks for a round after every logged training step (`logging_steps=1`
  for every step): `on_log(logs=...)` is where TRL's GRPOTrainer hands its metrics
  (`reward`, `reward_std`, `rewards/<fn>/mean`, ...) to callbacks. Given the trainer, it
  also writes the step's completions (TRL's completion log, which `log_completions=True`
  prints) as the round's rollouts file, each with its weighted reward as the score, and
  adds the batch's reward spread to the metrics (dyngen.trainers.spread): the share of
  prompts whose rewards are all equal (TRL's `frac_reward_zero_std`, computed from the
  completions where it is not logged) and the mean spread of each prompt's rewards.
  Each step's batch end goes first into the dataset's inbox in the store, as a step of
  the training run: `run_id` if given, else TRL's `args.run_name` (else the output_dir's
  name) with a suffix drawn when the run starts fresh, kept in `output_dir` so that a run
  resumed from a checkpoint keeps it and lands none of its re-logged steps twice.
- `FollowingDataset` is a `datasets.IterableDataset` over the newest committed version:
  a seeded permutation per pass, with rows committed meanwhile served first, so a round's
  rows are drawn within a block or two. Each block of `block_rows` rows reads the version
  the ranks agree on (the first rank to reach the block writes it down under the run's
  folder), so every rank sees the same sequence.

Neither imports TRL; install it with `pip install 'dyngen[trl]'`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import datasets
from datasets.iterable_dataset import ExamplesIterable
from transformers import TrainerCallback

from dyngen.difficulty.frontier import FrontierSampler, sampler_of
from dyngen.errors import ConfigError
from dyngen.locations import store_root as store_root_of
from dyngen.round.top_up import ROWS_WANTED
from dyngen.store import Store
from dyngen.trainers.dataset import DyngenDataset, Mode
from dyngen.trainers.inbox_write import record_batch_end
from dyngen.trainers.rollouts import (
    PromptIndex,
    event_id_for,
    rollout_record,
    rollouts_dir,
    safe_run_name,
    write_rollouts,
)
from dyngen.trainers.row_stream import RowStream
from dyngen.trainers.spread import ZERO_SPREAD_SHARE, finite, grouped, spread_metrics

logger = logging.getLogger(__name__)
TRL_ZERO_STD = "frac_reward_zero_std"  # GRPOTrainer's share of prompts with one reward
RUN_FILE = "dyngen-run.json"  # in the trainer's output_dir: the run id a resume keeps


class DyngenCallback(TrainerCallback):
    """Asks for a generation round after each logged training step of a Trainer.

    `DyngenCallback(store_root, dataset)`, as `DyngenDataset` and `FollowingDataset`
    (`store_root` None: $DYNGEN_STORE_ROOT, else `dyngen_store`). The old order,
    `DyngenCallback(dataset[, store_root])`, still works with a FutureWarning; see
    `_store_and_dataset` for how it is told apart.

    `every_n_steps`: a round every N steps. `record_every_step`: the steps between also go
    into the dataset's inbox (no round asked for), so the next round covers them and every
    trained group becomes a difficulty observation (what the frontier sampler draws by).
    Each batch end states `dyngen/rows_wanted`, the rows the trainer draws before its next
    round (`rows_per_round`, else prompts per step times N): a round that keeps fewer asks
    its generator again (round.top_up)."""

    def __init__(self, store_root: str | os.PathLike[str] | None = None,
                 dataset: str | None = None, *, trainer: Any = None, every_n_steps: int = 1,
                 run_id: str | None = None, mode: Mode = "emit",
                 config: Mapping[str, Any] | None = None, record_every_step: bool = False,
                 rows_per_round: int | None = None) -> None:
        store_root, dataset = _store_and_dataset(store_root, dataset)
        if not isinstance(dataset, str):
            raise ConfigError(f"DyngenCallback: expected a dataset name, found {dataset!r}. "
                              "Write DyngenCallback(store_root, dataset).")
        if isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int) \
                or every_n_steps < 1:
            raise ConfigError(f"every_n_steps: expected an integer >= 1, found "
                              f"{every_n_steps!r}. Set logging_steps=1 and every_n_steps=1 "
                              "for a round after every step.")
        if rows_per_round is not None and (isinstance(rows_per_round, bool) or not isinstance(
                rows_per_round, int) or rows_per_round < 0):
            raise ConfigError(f"rows_per_round: expected an integer >= 0 (rows the trainer "
                              f"draws between rounds) or None (worked out from the trainer's "
                              f"arguments), found {rows_per_round!r}.")
        self.source = DyngenDataset(store_root_of(store_root), dataset, mode=mode, config=config)
        self.dataset = dataset
        self.trainer = trainer
        self.every_n_steps = every_n_steps
        self.run_id = run_id
        self.record_every_step, self.rows_per_round = bool(record_every_step), rows_per_round
        self.results: dict[int, Any] = {}  # step -> event id or inline round summary
        self._prompts = PromptIndex(self.source.store, dataset)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Settle the run id: given, else kept in output_dir across resumes, else new."""
        if self.run_id is None and state.is_world_process_zero:
            self.run_id = _run_id(Path(args.output_dir), state.global_step,
                                  getattr(args, "run_name", None))

    def on_log(self, args: Any, state: Any, control: Any,
               logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        """A training step's log: ask for a round with its metrics and completions."""
        if not state.is_world_process_zero or not _is_step_log(logs):
            return
        step = int(state.global_step)
        asks = step % self.every_n_steps == 0
        if (not asks and not self.record_every_step) or step in self.results:
            return
        if self.run_id is None:  # on_log without on_train_begin (a caller of its own)
            self.run_id = _run_id(Path(args.output_dir), step, None)
        run = self.run_id
        metrics = {k: float(v) for k, v in (logs or {}).items() if finite(v)}
        if (wanted := self._rows_wanted(args)) is not None:
            metrics[ROWS_WANTED] = float(wanted)
        rollouts = None
        try:
            scored = _scored_completions(self.trainer)
            metrics.update(_spread_of(metrics, scored))
            rollouts = self._write_rollouts(run, step, scored)
        except Exception as exc:  # bookkeeping must never stop training
            logger.warning("dyngen: step %d's completions not read or written (%s: %s); the "
                           "round is asked for without them", step, type(exc).__name__, exc)
        if not asks:  # recorded for the next round to cover; no round asked for
            self.results[step] = record_batch_end(self.source.store, self.dataset, run, step,
                                                  metrics, rollouts, event_id_for(run, step))
            return
        self.results[step] = self.source.on_batch_end(
            step=step, metrics=metrics, rollouts=rollouts, event_id=event_id_for(run, step),
            run=run)

    def _rows_wanted(self, args: Any) -> int | None:
        """Rows the trainer draws before its next round: `rows_per_round`, else prompts per
        step (GRPO: completions per step / num_generations) times `every_n_steps`."""
        if self.rows_per_round is not None:
            return self.rows_per_round
        try:
            rows = (int(args.per_device_train_batch_size) * int(args.gradient_accumulation_steps)
                    * int(getattr(args, "world_size", 1) or 1))
        except (AttributeError, TypeError, ValueError):
            return None
        generations = getattr(args, "num_generations", None)
        if isinstance(generations, int) and generations > 0:
            rows = max(1, rows // generations)
        return rows * self.every_n_steps

    def _write_rollouts(self, run: str, step: int,
                        scored: list[tuple[Any, float | None]]) -> str | None:
        """The trainer's latest completions as a rollouts file, or None without them."""
        if not scored:
            return None
        self._prompts.refresh()
        records = [r for r in (rollout_record(prompt, score, self._prompts.truth_of(prompt))
                               for prompt, score in scored) if r is not None]
        if not records:
            return None
        path = rollouts_dir(self.source.store.root, self.dataset, run) / f"step-{step:08d}.jsonl"
        return str(write_rollouts(path, records))


def _store_and_dataset(first: Any, second: Any) -> tuple[Any, str]:
    """(store root, dataset) from `DyngenCallback`'s two leading arguments, in the new order
    (store_root, dataset) unless they are the old one (dataset, store_root), which warns.

    The old order is taken when: only one is given (`DyngenCallback("my-data")`: the
    dataset, in the default store); or the second is a location and the first is not (a
    `Path`, a URL, a path with a separator, `.` or `~`: never a dataset name); or, both
    being plain names, the second is an existing local store holding a dataset named by the
    first while the first holds none named by the second. Any other pair is the new order
    (a wrong guess then fails as a missing dataset, naming the store it looked in)."""
    if second is None and first is not None:  # one argument: the dataset, as it always was
        return _old_order(None, first)
    if _is_location(second) and not _is_location(first):
        return _old_order(second, first)
    if isinstance(first, str) and isinstance(second, str) and not _is_location(first) \
            and _holds(second, first) and not _holds(first, second):
        return _old_order(second, first)
    return first, second


def _is_location(value: Any) -> bool:
    """A store root for sure: a PathLike, or text a dataset name can never be."""
    if isinstance(value, os.PathLike):
        return True
    return isinstance(value, str) and (
        "://" in value or "/" in value or os.sep in value or value.startswith((".", "~")))


def _holds(root: str, dataset: str) -> bool:
    """Whether the local folder `root` is a store with a dataset `dataset`."""
    return os.path.isdir(os.path.join(root, dataset, "_versions"))


def _old_order(store_root: Any, dataset: Any) -> tuple[Any, str]:
    shown = None if store_root is None else os.fspath(store_root)
    warnings.warn(f"DyngenCallback: dataset {dataset!r} given before the store "
                  f"({shown!r}), the old order; write DyngenCallback(store_root, dataset) "
                  "as FollowingDataset takes them", FutureWarning, stacklevel=4)
    return store_root, dataset


def _scored_completions(trainer: Any) -> list[tuple[Any, float | None]]:
    """(prompt, weighted reward or None) of each of the trainer's latest completions."""
    logged = getattr(trainer, "_logs", None)
    if not isinstance(logged, Mapping) or not logged.get("prompt"):
        return []
    prompts = list(logged["prompt"])
    names = list(getattr(trainer, "reward_func_names", None) or logged["rewards"])
    weights = getattr(trainer, "reward_weights", None)
    weights = [1.0] * len(names) if weights is None else [float(w) for w in weights]
    columns = [list(logged["rewards"].get(name, [])) for name in names]
    out: list[tuple[Any, float | None]] = []
    for i, prompt in enumerate(prompts):
        parts = [w * col[i] for w, col in zip(weights, columns, strict=True)
                 if i < len(col) and col[i] is not None and not math.isnan(col[i])]
        out.append((prompt, sum(parts) if parts else None))
    return out


def _spread_of(metrics: Mapping[str, float], scored: list[tuple[Any, float | None]]
               ) -> dict[str, float]:
    """The batch's spread metrics: TRL's own zero-std share where it logged one."""
    out = spread_metrics(grouped(scored))
    if TRL_ZERO_STD in metrics:
        out[ZERO_SPREAD_SHARE] = metrics[TRL_ZERO_STD]
    return out


def _is_step_log(logs: Mapping[str, Any] | None) -> bool:
    """A training step's log, not an evaluation's or the end-of-training summary."""
    if not logs or "train_runtime" in logs or any(str(k).startswith("eval_") for k in logs):
        return False
    return "loss" in logs or "reward" in logs or any(str(k).startswith("rewards/") for k in logs)


def _run_id(output_dir: Path, global_step: int, run_name: str | None) -> str:
    """The run's id: a fresh run gets a new one; a resumed run (step > 0) keeps its own."""
    path = output_dir / RUN_FILE
    if global_step > 0 and path.is_file():
        try:
            return str(json.loads(path.read_text())["run_id"])
        except (ValueError, KeyError, TypeError):
            logger.warning("dyngen: %s is unreadable; this run gets a new id", path)
    run = safe_run_name(f"{run_name or output_dir.name}-{os.urandom(4).hex()}")
    output_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"run_id": run}))
    return run


class FollowingDataset(datasets.IterableDataset):
    """The rows of the newest committed version, as an endless, seeded stream.

    Pass `max_steps` to the trainer (the stream never ends). Rows are the stored rows
    (verl's schema plus `_dyngen_*` provenance); the prompt column the dataset was
    imported with is also served as `prompt`, the column TRL reads. `shuffle` (which TRL
    calls) reseeds the stream instead of adding a buffer that would hold new rows back.
    `sampler`: "fresh_first" (new rows first, then seeded passes over every row) or
    "frontier" / a FrontierSampler (draws by each row's difficulty record; set its `group`
    to the trainer's num_generations): see dyngen.difficulty.frontier.
    """

    def __init__(self, store_root: str | os.PathLike[str] | None, dataset: str, *,
                 seed: int = 0, block_rows: int = 16, run_id: str | None = None,
                 sampler: str | FrontierSampler | None = "fresh_first") -> None:
        if isinstance(block_rows, bool) or not isinstance(block_rows, int) or block_rows < 1:
            raise ConfigError(f"block_rows: expected an integer >= 1, found {block_rows!r}.")
        self.store_root, self.dataset_name = store_root_of(store_root), dataset
        self.seed, self.block_rows, self.run_id = seed, block_rows, run_id
        self.sampler = sampler
        Store(self.store_root).head(dataset)  # fails now, naming the store, if missing
        stream = RowStream(self.store_root, dataset, seed, block_rows, run_id,
                           sampler=sampler_of(sampler))
        super().__init__(ExamplesIterable(stream, {}))

    def shuffle(self, seed: int | None = None, generator: Any = None,
                buffer_size: int = 1000) -> FollowingDataset:
        """The same stream with another seed: it is shuffled already, pass by pass."""
        return FollowingDataset(self.store_root, self.dataset_name,
                                seed=self.seed if seed is None else seed,
                                block_rows=self.block_rows, run_id=self.run_id,
                                sampler=self.sampler)
