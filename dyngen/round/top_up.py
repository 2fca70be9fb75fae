"""Asking again: a round that keeps fewer rows than the trainer will draw before the next
round asks its generator for more, within a budget (`round.top_up`).

How many rows are wanted: `round.top_up.min_rows` when set, else what the trainer states
in its newest batch end's `dyngen/rows_wanted` metric (DyngenCallback states its prompts
per step times its steps per round), else none. Each new call gets `context.attempt` 1, 2,
... (generators seed by `context.round_seed`), its rows join the round's, and the filter
chain runs over all of them again: a later row that repeats an earlier one is a duplicate,
and the solve-rate stage grades no row twice (`RowFilter.memo`). It stops when enough rows
are kept, when `max_attempts` calls are spent, or when a call wrote only rows an earlier
call wrote (a generator that ignores `context.attempt` writes the same rows again). The version's
lineage records it under `top_up`.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig

from dyngen.filters.base import FilterOutcome
from dyngen.round.context import RoundContext

ROWS_WANTED = "dyngen/rows_wanted"  # the batch-end metric a trainer states its draw in


def rows_wanted(cfg: DictConfig, context: RoundContext) -> int:
    """The rows this round should keep at least: the config's, else the trainer's, else 0."""
    if cfg.round.top_up.min_rows is not None:
        return int(cfg.round.top_up.min_rows)
    stated = context.metrics.get(ROWS_WANTED)
    if stated is None or not math.isfinite(stated) or stated <= 0:
        return 0
    return math.ceil(stated)


@dataclass
class TopUp:
    """A round's calls to its generator: the rows so far, their filtering, and what asking
    again did (rows wanted, kept after each call, why it stopped)."""

    context: RoundContext  # the round's, as its first call got it
    wanted: int
    max_attempts: int
    kept: list[int] = field(default_factory=list)  # rows kept after each call, cumulative
    generated: list[int] = field(default_factory=list)  # rows each call wrote
    stopped: str = "enough"
    rows: Any = None  # every call's rows, in call order (a RowBatch)
    outcome: FilterOutcome | None = None  # the chain's over all of them
    generator: dict[str, Any] = field(default_factory=dict)  # the first call's lineage
    fanned_out: dict[str, Any] | None = None  # the first call's partitions
    _next: RoundContext | None = None
    _written: set[str] = field(default_factory=set)  # every row written so far, as JSON
    _repeated: bool = False  # the last call wrote only rows written before

    @classmethod
    def of(cls, cfg: DictConfig, context: RoundContext) -> TopUp:
        return cls(context, rows_wanted(cfg, context), int(cfg.round.top_up.max_attempts),
                   _next=context)

    @property
    def name(self) -> str:
        """The generator's class name (its shard is recorded under it)."""
        return str(self.generator["name"])

    def next_context(self) -> RoundContext | None:
        """The context of the next call to the generator; None when the round is done."""
        context, self._next = self._next, None
        return context

    def add(self, rows: Any, generator: dict[str, Any],
            fanned_out: dict[str, Any] | None) -> Any:
        """A call's rows, lineage and partitions: every row so far, to filter together."""
        from dyngen.round.partitions import union_rows

        if self.rows is None:
            self.generator, self.fanned_out = generator, fanned_out
        self.generated.append(len(rows))
        if self.wanted > 0:  # only a round that may ask again compares its calls' rows
            written = {json.dumps(row, sort_keys=True, default=str) for row in rows.to_list()}
            self._repeated = written <= self._written  # nothing an earlier call had not written
            self._written |= written
        self.rows = rows if self.rows is None else union_rows([self.rows, rows])
        return self.rows

    def filtered(self, outcome: FilterOutcome) -> FilterOutcome:
        """The chain's outcome over every row so far; decides whether to ask again."""
        self.outcome = outcome
        self.kept.append(len(outcome.kept))
        attempt = len(self.kept) - 1
        if self.kept[-1] >= self.wanted:
            self.stopped = "enough"
        elif len(self.kept) >= self.max_attempts:
            self.stopped = "budget"
        elif attempt > 0 and self._repeated:
            self.stopped = "repeats"  # the generator wrote nothing new: asking again is futile
        else:
            self._next = dataclasses.replace(self.context, attempt=attempt + 1)
        return outcome

    def lineage(self) -> dict[str, Any] | None:
        """The `top_up` entry of the version's lineage; None when no minimum was asked."""
        if self.wanted <= 0:
            return None
        return {"wanted": self.wanted, "attempts": len(self.kept), "kept": list(self.kept),
                "generated": list(self.generated), "stopped": self.stopped}

    def message(self) -> str | None:
        """The log line when the round stopped short of what was wanted."""
        if self.wanted <= 0 or self.stopped == "enough":
            return None
        why = {"budget": f"round.top_up.max_attempts ({self.max_attempts}) calls spent",
               "repeats": "the generator's last call wrote only rows it had written before: "
                          "does it seed by context.round_seed (or context.attempt)?"}
        return (f"kept {self.kept[-1]} rows of the {self.wanted} wanted after "
                f"{len(self.kept)} generator calls; {why[self.stopped]}")
