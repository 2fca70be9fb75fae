"""`dyngen follow`: verl's default (V1) trainer triggers rounds with no code change.

verl's V1 trainer never calls the dataset's `on_batch_end`, but it writes each step's
metrics to a file and, with `trainer.rollout_data_dir`, each step's rollouts (see
`verl_files`). `VerlFollower` tails both and emits one batch-end event per completed
training step (every `every_n_steps`-th), with the step's metrics and its rollouts
converted to dyngen's rollouts file under `<store root>/rollouts/<dataset>/<run>/`.
verl's metrics hold no per-prompt reward spread; from the rollouts (each prompt's scores)
the follower adds `dyngen/zero_spread_share` and `dyngen/reward_spread`
(dyngen.trainers.spread), counting the groups verl's DAPO filter (`algorithm.filter_groups`)
evicted or discarded before the dump where its metrics report them; and
`dyngen/rows_wanted`, the prompts the step drew times `every_n_steps`, the rows the next
round should keep (dyngen.round.top_up).

Each step's batch end is written into the dataset's inbox in the store first, rollouts
included, as a step of the training run `run_id` (default: from the metrics file's name,
which is verl's `trainer.experiment_name` unless VERL_FILE_LOGGER_PATH names another, and
its path); then its event is sent. Exactly once per step, across restarts of the follower
and of verl: the store keeps one entry per (run, step), the event id is derived from the
run id and the step (the round's idempotency key), and the last step emitted is kept in
`<run folder>/follow.json`, so a step a restarted trainer logs again is not emitted again.
The batch end is recorded in the store's inbox (one the store cannot take waits in the
local retry queue), and the event only wakes a round: one the server cannot take is not
kept, as the next round covers the batch end; a batch end the store refused has only its
event, which waits in the outbox (`send_batch_end`). None is lost while the server or the
store is down. This module never imports verl.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from dyngen.errors import ConfigError
from dyngen.round.top_up import ROWS_WANTED
from dyngen.store import Store
from dyngen.trainers.events import send_batch_end
from dyngen.trainers.rollouts import (
    PromptIndex,
    event_id_for,
    rollout_record,
    rollouts_dir,
    write_rollouts,
)
from dyngen.trainers.spread import finite, grouped, spread_metrics
from dyngen.trainers.verl_files import (
    MetricsTail,
    StepMetrics,
    dump_path,
    read_complete_dump,
    training_step,
)

logger = logging.getLogger(__name__)

MAX_METRICS = 256  # what a round's trigger accepts (dyngen.round.MAX_METRICS)
# Kept first when a step logs more metrics than a trigger carries: what generators read.
PREFERRED_METRICS = ("score", "reward", "acc", "response_length")
STATE_FILE = "follow.json"
# verl's DAPO filter's counts of prompt groups it left out of the step's batch (and dump):
# evicted for a metric all its samples share, discarded as surplus with a spread.
DAPO_EVICTED = "training/filter_groups/evicted_samples"
DAPO_SURPLUS = "training/filter_groups/discarded_surplus_samples"


def default_run_id(dataset: str, metrics_path: Path) -> str:
    """A run id stable across restarts: the metrics file's name and absolute path."""
    digest = hashlib.sha256(str(metrics_path.resolve()).encode()).hexdigest()[:10]
    return f"{dataset}-{metrics_path.stem}-{digest}"


def trigger_metrics(data: dict[str, Any], most: int = MAX_METRICS) -> dict[str, float]:
    """The step's finite numeric metrics, at most `most`, reward-like ones first."""
    numeric = {str(k): float(v) for k, v in data.items() if finite(v)}
    if len(numeric) <= most:
        return numeric
    ranked = sorted(numeric, key=lambda k: (not any(p in k for p in PREFERRED_METRICS), k))
    return {k: numeric[k] for k in ranked[:most]}


def dump_spread(metrics: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, float]:
    """The step's spread metrics from its rollout dump (each prompt's scores), with the
    groups verl's DAPO filter left out of the dump counted where it logged them."""
    if not rows:
        return {}
    return spread_metrics(grouped((row.get("input"), row.get("score")) for row in rows),
                          zero_spread_extra=_count(metrics.get(DAPO_EVICTED)),
                          spread_extra=_count(metrics.get(DAPO_SURPLUS)))


def dump_rows_wanted(metrics: dict[str, Any], rows: list[dict[str, Any]], every_n_steps: int
                     ) -> dict[str, float]:
    """`dyngen/rows_wanted`: the prompts verl drew for the step (those in its dump, and the
    groups DAPO's filter left out) times the steps to the next round; none without a dump."""
    if not rows:
        return {}
    drawn = (len({str(row.get("input")) for row in rows}) + _count(metrics.get(DAPO_EVICTED))
             + _count(metrics.get(DAPO_SURPLUS)))
    return {ROWS_WANTED: float(drawn * every_n_steps)}


def _count(value: Any) -> int:
    """A logged count (verl logs floats), 0 when it is not one."""
    return int(value) if finite(value) and value >= 0 else 0


@dataclass
class VerlFollower:
    """Tails a verl job's metrics file (and rollout folder) and emits a batch end per step."""

    store_root: Path
    dataset: str
    metrics_path: Path
    rollout_dir: Path | None = None
    every_n_steps: int = 1
    run_id: str | None = None
    rollout_wait_seconds: float = 60.0
    settle_seconds: float = 0.5
    api_url: str | None = None
    store: Any = None  # the Store at store_root (with its storage options); None: opened here
    emitted: list[StepMetrics] = field(default_factory=list)  # this process's, in order
    # Told of each step emitted: its number, what became of it, how many rollouts went
    # with it (`dyngen follow` prints a line per step).
    on_emit: Callable[[int, Any, int], None] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.every_n_steps, bool) or not isinstance(self.every_n_steps, int) \
                or self.every_n_steps < 1:
            raise ConfigError(f"--every-n-steps: expected an integer >= 1, found "
                              f"{self.every_n_steps!r}.")
        if self.store is None:
            self.store = Store(self.store_root)
        self.store.head(self.dataset)  # fails now, naming the store, if it does not exist
        self.metrics_path = Path(self.metrics_path)
        self.run_id = self.run_id or self._default_run_id()
        self.folder = rollouts_dir(self.store.root, self.dataset, self.run_id)
        self.tail = MetricsTail(self.metrics_path)
        self.last_step = self._load_state()
        self._waiting: deque[tuple[StepMetrics, float]] = deque()  # steps awaiting rollouts
        self._prompts = PromptIndex(self.store, self.dataset) if self.rollout_dir else None

    def _default_run_id(self) -> str:
        """The training run's id when none is given (verl: its experiment's file)."""
        return default_run_id(self.dataset, self.metrics_path)

    # ---- the loop ------------------------------------------------------------------
    def run(self, poll_seconds: float = 1.0, stop_after_idle: float | None = None) -> None:
        """Follow until interrupted (or idle for `stop_after_idle` seconds)."""
        idle_since = time.monotonic()
        while True:
            if self.poll():
                idle_since = time.monotonic()
            elif stop_after_idle is not None and time.monotonic() - idle_since > stop_after_idle:
                return
            time.sleep(poll_seconds)

    def poll(self) -> int:
        """Read new lines, emit every step that is ready; return how many were emitted."""
        for record in self.tail.read():
            step = self._training_step(record)
            if step is None or step.step <= self.last_step or step.step % self.every_n_steps:
                continue
            if self._waiting and step.step <= self._waiting[-1][0].step:
                continue  # already waiting for it (a restart re-logged it)
            self._waiting.append((step, time.monotonic()))
        emitted = 0
        while self._waiting:
            step, since = self._waiting[0]
            found = self._rollouts_for(step.step, since)
            if found is False:
                break  # not written yet: later steps wait behind it, in order
            rollouts, rows = found
            self._emit(step, rollouts, rows)
            self._waiting.popleft()
            emitted += 1
            if self._waiting:  # the next step's wait starts now, not while it queued
                self._waiting[0] = (self._waiting[0][0], time.monotonic())
        return emitted

    # ---- one step (a trainer's format: prime_rl_follow overrides these two) ----------
    def _training_step(self, record: dict[str, Any]) -> StepMetrics | None:
        """A metrics line's training step, or None for lines that end no batch."""
        return training_step(record)

    def _rollouts_for(self, step: int, since: float
                      ) -> tuple[str | None, list[dict[str, Any]]] | Literal[False]:
        """(the converted rollouts file, the step's scored lines as verl dumps them:
        `input` and `score`), (None, []) to emit without, or False to wait longer."""
        if self.rollout_dir is None:
            return None, []
        source = dump_path(self.rollout_dir, step)
        rows = read_complete_dump(source, self.settle_seconds)
        if rows is None:
            if time.monotonic() - since < self.rollout_wait_seconds:
                return False
            logger.warning("dyngen follow: step %d's rollouts %s did not appear complete "
                           "within %.0f s; its batch end is emitted without rollouts",
                           step, source, self.rollout_wait_seconds)
            return None, []
        return str(self._convert(step, rows, source)), rows

    def _convert(self, step: int, rows: list[dict[str, Any]], source: Path) -> Path:
        """verl's rollout lines as dyngen rollouts, prompts mapped back to the dataset's."""
        assert self._prompts is not None
        self._prompts.refresh()
        records, unmatched = [], 0
        for row in rows:
            text = str(row.get("input") or "")
            found = self._prompts.lookup(text)
            if found is None:
                unmatched += 1
            prompt, truth = found if found is not None else (text, None)
            gts = row.get("gts")
            record = rollout_record(prompt, row.get("score"), truth if gts is None else gts)
            if record is not None:
                records.append(record)
        if unmatched:
            logger.warning("dyngen follow: %d of %d rollouts of step %d match no prompt of %r; "
                           "they keep verl's decoded input as their prompt", unmatched,
                           len(rows), step, self.dataset)
        if len(records) < len(rows):
            logger.warning("dyngen follow: %s: %d line(s) without a finite score skipped",
                           source, len(rows) - len(records))
        return write_rollouts(self.folder / f"step-{step:08d}.jsonl", records)

    def _emit(self, step: StepMetrics, rollouts: str | None, rows: list[dict[str, Any]]
              ) -> None:
        derived = {**dump_spread(step.metrics, rows),
                   **dump_rows_wanted(step.metrics, rows, self.every_n_steps)}
        metrics = {**trigger_metrics(step.metrics, MAX_METRICS - len(derived)), **derived}
        sent = send_batch_end(self.dataset, step.step, metrics, rollouts,
                              event_id=event_id_for(str(self.run_id), step.step),
                              api_url=self.api_url, store=self.store, run=str(self.run_id))
        if sent.status == "dropped" and sent.inbox not in ("written", "kept", "queued"):
            logger.warning("dyngen follow: step %d's batch end was dropped (see above)",
                           step.step)
        self.last_step = step.step
        self._save_state()
        self.emitted.append(step)
        if self.on_emit is not None:
            self.on_emit(step.step, sent, len(rows) if rollouts is not None else 0)

    # ---- state ---------------------------------------------------------------------
    def _load_state(self) -> int:
        path = self.folder / STATE_FILE
        try:
            state = json.loads(path.read_text())
            return int(state["last_step"])
        except FileNotFoundError:
            return -1
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"{path}: expected {{\"last_step\": N}}, found unreadable state "
                              f"({exc}). Delete the file to emit every step again (rounds "
                              "already committed are not repeated).") from exc

    def _save_state(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.folder / f".{STATE_FILE}.tmp"
        tmp.write_text(json.dumps({"run_id": self.run_id, "last_step": self.last_step,
                                   "metrics_file": str(self.metrics_path.resolve())}))
        os.replace(tmp, self.folder / STATE_FILE)
