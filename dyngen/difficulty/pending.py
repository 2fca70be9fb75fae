"""What the trainer saw since the version a sampler reads: the inbox's pending batch ends.

A round folds the batch ends it covers into the difficulty record when it commits; until
then each one waits in the dataset's inbox, in the store. Rounds take longer than training
steps, so a sampler that waited for them would draw by what the policy did several steps
ago. The frontier sampler reads the pending batch ends too: each prompt's group of
completions at step s weighs the next draws from s on. They are only read. The committed
record stays the audit, and once a version covers a batch end it counts from the record
alone, not twice.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from contextlib import suppress
from typing import Any

from dyngen.difficulty.observe import prompt_groups
from dyngen.difficulty.record import Observation
from dyngen.errors import DyngenError, RolloutsError
from dyngen.rollout_format import Rollout, rollout_of
from dyngen.store.covered import Key
from dyngen.store.keys import prompt_key

logger = logging.getLogger(__name__)


class PendingBatchEnds:
    """The batch ends of `dataset` no version covers yet, as observations of its rows;
    each entry is read once (entries are immutable)."""

    def __init__(self, store: Any, dataset: str, threshold: float = 1.0) -> None:
        self.store, self.dataset, self.threshold = store, dataset, threshold
        self._read: dict[Key, list[tuple[Any, int, int]]] = {}  # (run, step) -> its groups

    def keys(self, version: int) -> list[Key]:
        """The pending batch ends at `version`, by (run, step) (listed, not read); what was
        read of those covered since is let go."""
        out = self.store.pending_keys(self.dataset, version)
        for gone in set(self._read) - set(out):
            del self._read[gone]
        return out

    def observations(self, keys: Iterable[Sequence[Any]], known: set[int]
                     ) -> list[Observation]:
        """The groups of the batch ends `keys` names, of rows whose prompt key is `known`."""
        out = []
        for run, step in keys:
            key = (str(run), int(step))
            if key not in self._read:
                entry = self.store.batch_end(self.dataset, *key)
                if entry is None:  # named by another rank, then swept: nothing to weigh
                    continue
                self._remember(entry)
            out += [Observation(k, key[1], passed, samples)
                    for prompt, passed, samples in self._read[key]
                    if (k := prompt_key(prompt)) in known]
        return out

    def _remember(self, entry: Any) -> None:
        try:
            rollouts = self.store.read_rollouts(entry)
        except DyngenError as exc:  # missing or damaged: the round that covers it says so
            logger.debug("dyngen: pending batch end not weighed: %s", exc)
            rollouts = []
        scored = [(r.prompt, r.score) for r in _rollouts(rollouts)]
        self._read[entry.key] = prompt_groups(scored, self.threshold)


def _rollouts(records: list[Any]) -> list[Rollout]:
    """The records that are rollouts by the round's rule (others are not weighed: the round
    that covers the batch end names them)."""
    out = []
    for number, record in enumerate(records, 1):
        with suppress(RolloutsError):
            out.append(rollout_of(record, number, "pending batch end"))
    return out
