"""Generators for the rounds that cover their dataset's inbox (tests/flows/test_round_inbox.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import datasets

from dyngen.generators.base import AbstractDataGenerator
from dyngen.store import Store
from tests.rows import verl_row


def seen_by(context: Any) -> dict[str, Any]:
    """What a generator saw of the round's batch ends, as JSON."""
    return {
        "batch_ends": [{"run": b.run, "step": b.step, "metrics": b.metrics,
                        "rollouts": [r.prompt for r in b.rollouts],
                        "rollouts_error": b.rollouts_error} for b in context.batch_ends],
        "step": context.step, "metrics": context.metrics, "run": context.run,
        "trigger_step": context.trigger.step,
        "read_rollouts": [r.prompt for r in context.read_rollouts()],
    }


class SeesBatchEnds(AbstractDataGenerator):
    """One new row; writes what it saw of the round's batch ends to the file `seen`."""

    def generate(self, dataset: Any, context: Any = None) -> datasets.Dataset:
        Path(self.config.seen).write_text(json.dumps(seen_by(context)))
        return datasets.Dataset.from_list([verl_row(800 + context.round, source="inbox")])


class CoveredMeanwhile(SeesBatchEnds):
    """SeesBatchEnds, but while it generates, another Store object on the same root commits
    a version covering everything pending: a concurrent round that wins the race."""

    def generate(self, dataset: Any, context: Any = None) -> datasets.Dataset:
        rival = Store(self.config.root)
        rival.append(context.dataset, [verl_row(900, source="rival")],
                     covers=rival.pending(context.dataset), compact=False)
        return super().generate(dataset, context)


class FirstCoveredMeanwhile(SeesBatchEnds):
    """SeesBatchEnds, but on its first call another Store object on the same root commits a
    version covering only the oldest pending batch end: a rival round that had loaded
    before the rest were written wins the race."""

    def generate(self, dataset: Any, context: Any = None) -> datasets.Dataset:
        rival = Store(self.config.root)
        pending = rival.pending(context.dataset)
        if context.round == 1:
            rival.append(context.dataset, [verl_row(900, source="rival")],
                         covers=pending[:1], compact=False)
        return super().generate(dataset, context)
