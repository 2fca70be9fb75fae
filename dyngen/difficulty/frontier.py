"""The frontier sampler: draw the rows a trainer's group can learn from, measured recently.

Each row of the version the trainer reads is weighted by

   (P(a group of `group` completions has mixed rewards)  (from the row's posterior)
  [× 0.5 ** (age / recency_half_life), when set])         (age: steps since it was observed)
  ** sharpness                                            (1: in proportion to that chance)

where the posterior counts evidence `half_life_steps` old at half weight: by default one
step, so a row's newest group says most, and a row not seen for a while falls back toward
the prior. That is how recency enters by default. In the closed-loop benchmark a GRPO step
moves a row it trains on, so the row's group two steps ago predicted its next group better
than its older evidence did. A separate recency factor favoured rows the trainer had just
trained on, which were the likeliest to have become all right (docs/benchmarks.md). A row
weighs nothing when it is retired, when its newest observation is more than
`max_age_steps` older than the newest step observed, or when it was never observed (unless
`unmeasured`). The record is the version's, and (`inbox`, the default) the batch ends the
store's inbox holds that no version covers yet: each group the trainer saw at step s counts
from s on, not from the commit of the round that covers it (dyngen.difficulty.pending).
A block of rows is drawn without replacement by weight, with a generator
seeded by (seed, block), skipping rows already drawn since the record last changed (a
round's new observations, a new batch end) while others are left: so the draw is
deterministic from the seed, the versions and the batch ends read, and `state_dict` /
`load_state_dict` resume it exactly. With no row to draw (no round has measured anything
yet), it draws every row not retired uniformly and says so once.

`fresh_first` is the sampler dyngen had before, kept by name as the baseline: rows new since
the last version first, then seeded passes over every row (dyngen.trainers.row_stream).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from dyngen.difficulty.pending import PendingBatchEnds
from dyngen.difficulty.record import DifficultyBook
from dyngen.errors import ConfigError
from dyngen.store.keys import prompt_keys

logger = logging.getLogger(__name__)
SAMPLERS = ("fresh_first", "frontier")


@dataclass(frozen=True)
class FrontierSampler:
    """How the frontier sampler weighs rows; `group`: completions per prompt the trainer
    samples (TRL's num_generations, verl's rollout.n)."""

    group: int = 8
    max_age_steps: int = 8
    recency_half_life: float | None = None  # None: no factor beyond the posterior's
    half_life_steps: float = 1.0  # of the posterior's evidence
    unmeasured: bool = False  # draw rows never observed (at the prior's weight)
    inbox: bool = True  # weigh the batch ends no version covers yet, too
    pass_threshold: float = 1.0  # a trainer's completion passes at this score (as a round's)
    sharpness: float = 1.0  # weights are raised to it: above 1, the likeliest rows go first

    def __post_init__(self) -> None:
        whole, number = (int,), (int, float)
        for name, kinds, ok, expected in (
                ("group", whole, lambda v: v >= 2, "a whole number >= 2"),
                ("max_age_steps", whole, lambda v: v >= 0, "a whole number of steps >= 0"),
                ("half_life_steps", number, lambda v: v > 0, "a number of steps > 0"),
                ("sharpness", number, lambda v: v > 0, "a number > 0 (1: draw in proportion "
                 "to the chance of a mixed group)"),
                ("recency_half_life", number, lambda v: v > 0,
                 "a number of steps > 0, or None for no recency factor"),
                ("pass_threshold", number, lambda v: True,
                 "a finite number (the score at which a completion passes, as "
                 "round.solve_rate.pass_threshold)")):
            value = getattr(self, name)
            if name == "recency_half_life" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, kinds) \
                    or not math.isfinite(value) or not ok(value):
                raise ConfigError(f"FrontierSampler.{name}: expected {expected}, found "
                                  f"{value!r}.")


def sampler_of(value: Any) -> FrontierSampler | None:
    """A sampler setting as given to a dataset: None for fresh_first, else the frontier's."""
    if value is None or value == "fresh_first":
        return None
    if value == "frontier":
        return FrontierSampler()
    if isinstance(value, FrontierSampler):
        return value
    if isinstance(value, dict):
        return FrontierSampler(**value)
    raise ConfigError(f"sampler: expected one of {', '.join(SAMPLERS)} or a FrontierSampler, "
                      f"found {value!r}. fresh_first is today's order (new rows first, then "
                      "uniform passes); frontier draws by each row's difficulty record.")


def frontier_weights(book: DifficultyBook, keys: np.ndarray, s: FrontierSampler) -> np.ndarray:
    """The weight of each row (by its prompt key) under the record `book` holds."""
    out = np.zeros(len(keys))
    for i, key in enumerate(keys.tolist()):
        if key in book.retired:
            continue
        post = book.estimate(key, s.half_life_steps)
        if post.last_step is None:
            out[i] = post.mixed_chance(s.group) if s.unmeasured else 0.0
            continue
        age = book.now - post.last_step
        if age <= s.max_age_steps:
            recency = 1.0 if s.recency_half_life is None else 0.5 ** (age / s.recency_half_life)
            out[i] = post.mixed_chance(s.group) * recency
    return out ** s.sharpness if s.sharpness != 1.0 else out


def weighted_slots(weights: np.ndarray, seed: list[int]) -> np.ndarray | None:
    """For a sampler that visits every index of an epoch once (verl's): the row that fills
    each index, drawn with replacement by weight, seeded; None when no row weighs anything."""
    if not len(weights) or not (weights > 0).any():
        return None
    rng = np.random.default_rng(seed)
    return rng.choice(len(weights), size=len(weights), p=weights / weights.sum())


class FrontierPlan:
    """Which rows come next, by weight; the same interface as row_stream's fresh-first plan."""

    def __init__(self, seed: int, sampler: FrontierSampler, store: Any, dataset: str) -> None:
        self.seed, self.sampler, self.store, self.dataset = seed, sampler, store, dataset
        self.record = DifficultyBook()  # as of the version read
        self.book = self.record  # what rows are weighed by: the record and `folded`
        self.pending = PendingBatchEnds(store, dataset, sampler.pass_threshold)
        self.folded: list[tuple[str, int]] = []  # the pending batch ends `book` adds
        self.refold = False  # `book` lacks `folded` (a version was read): fold them again
        self.keys = np.zeros(0, dtype=np.uint64)
        self.known: set[int] = set()
        self.weights = np.zeros(0)
        self.drawn: set[int] = set()
        self.block = 0
        self._said_uniform = False

    def update(self, old: Any, new: Any, extends: bool, data: Any = None) -> None:
        """Read version `new` (its rows `data`): new rows' keys, the record up to it."""
        if old is None or not extends:
            self.record, self.keys, self.known = DifficultyBook(), np.zeros(0, np.uint64), set()
        if data is not None and len(self.keys) < new.rows:
            column = new.prompt_key if new.prompt_key in data.column_names else "prompt"
            fresh = prompt_keys(list(data.select(range(len(self.keys), new.rows))[column]))
            self.keys = np.concatenate([self.keys, fresh])
            self.known.update(fresh.tolist())
        if self.record.advance(self.store, self.dataset, new.version) or old is None:
            self.drawn = set()
        self.book, self.refold = self.record, bool(self.folded)
        self.weights = self.weigh()

    def pending_at(self, version: int) -> list[tuple[str, int]]:
        """The batch ends to weigh beside version `version`'s record (none without `inbox`)."""
        return self.pending.keys(version) if self.sampler.inbox else []

    def fold(self, keys: list[Any]) -> None:
        """Weigh rows by the record and the pending batch ends `keys` names."""
        folded = sorted((str(run), int(step)) for run, step in keys)
        if folded == self.folded and not self.refold:
            return
        if folded != self.folded:
            self.drawn = set()  # the record changed
        observed = self.pending.observations(folded, self.known)
        self.book = self.record.overlaid(observed) if observed else self.record
        self.folded, self.refold = folded, False
        self.weights = self.weigh()

    def weigh(self) -> np.ndarray:
        """Each row's weight under the record as it stands."""
        return frontier_weights(self.book, self.keys, self.sampler)

    def take(self, count: int, rows: int) -> list[int]:
        """The next `count` row indices (of a version with `rows` rows; none of none)."""
        if rows <= 0 or count <= 0:
            return []
        weights = self.weights[:rows].copy()
        rng = np.random.default_rng([self.seed, self.block])
        self.block += 1
        if not (weights > 0).any():
            if not self._said_uniform:
                logger.warning("dyngen: frontier sampler of %s: no row has a recent measurement "
                               "yet; drawing rows uniformly until a round records some",
                               self.dataset)
                self._said_uniform = True
            weights = np.array([0.0 if k in self.book.retired else 1.0
                                for k in self.keys[:rows].tolist()])
            if not (weights > 0).any():
                weights = np.ones(rows)
        out: list[int] = []
        while len(out) < count:
            left = weights.copy()
            left[[i for i in self.drawn if i < rows]] = 0.0
            if not (left > 0).any():
                self.drawn = set()  # every drawable row was drawn: start over
                continue
            n = min(count - len(out), int((left > 0).sum()))
            picked = rng.choice(len(left), size=n, replace=False, p=left / left.sum())
            out.extend(int(i) for i in picked)
            self.drawn.update(out)
        return out

    def shown(self, index: int) -> dict[str, Any]:
        """What the record says of row `index`: its estimated pass rate, completions
        observed, newest observation's step and the weight it was drawn by."""
        post = self.book.estimate(int(self.keys[index]), self.sampler.half_life_steps)
        return {"pass_rate": round(post.mean, 4), "samples": post.samples,
                "last_step": post.last_step, "weight": round(float(self.weights[index]), 6)}

    def state_dict(self) -> dict[str, Any]:
        """What resuming needs: the blocks drawn, which rows since the record changed, and
        the pending batch ends weighed."""
        return {"block": self.block, "drawn": sorted(self.drawn),
                "version": self.record.version, "pending": [list(k) for k in self.folded]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue as the plan that saved `state` would (after update to its version)."""
        self.fold(state.get("pending") or [])
        self.block = int(state["block"])
        self.drawn = {int(i) for i in state["drawn"]}
