"""The generator contract kept from verl's DynamicGenDataset, and its no-op mock."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import Any, Protocol, runtime_checkable

import datasets
from omegaconf import DictConfig

from dyngen.context import RoundContext

logger = logging.getLogger(__name__)


@runtime_checkable
class HasDataframe(Protocol):
    """A verl-style dataset (e.g. RLHFDataset) whose raw rows live in ``.dataframe``."""

    dataframe: datasets.Dataset


GeneratorInput = datasets.Dataset | HasDataframe


def rows_of(dataset: GeneratorInput) -> datasets.Dataset:
    """Return the raw rows of a ``datasets.Dataset`` or of a verl-style wrapper."""
    # verl hands generators its RLHFDataset, whose __getitem__ yields tokenized
    # tensors; the untouched rows a generator wants are in .dataframe.
    return getattr(dataset, "dataframe", dataset)


class AbstractDataGenerator(ABC):
    """Makes new training rows from the current dataset; built with the ``datagen`` config.

    The round reads two mappings a generator may set in ``generate`` and records both in
    the version's lineage: ``state`` (JSON-able memory across rounds, handed back as
    ``context.previous_state`` next time, in this process or after a restart) and
    ``stats`` (a few counts, e.g. proposed / kept / dropped by reason).
    """

    state: dict[str, Any] | None = None
    stats: dict[str, Any] | None = None
    # Set by the round before `generate`, for generators written before `context=`.
    round_context: RoundContext | None = None

    def __init__(self, config: DictConfig | None) -> None:
        self.config = config

    @abstractmethod
    def generate(self, dataset: GeneratorInput,
                 context: RoundContext | None = None) -> datasets.Dataset:
        """Return only the NEW rows, in verl's schema; never modify ``dataset``.

        ``context`` is the round's (dataset, round, trigger, previous_state, partition);
        None outside a round. A subclass may leave it out (verl's signature): the round
        passes it only to a ``generate`` that declares it.
        """


class MockDataGenerator(AbstractDataGenerator):
    """Returns the first row of the dataset unchanged, as verl's mock does."""

    def __init__(self, config: DictConfig | None = None) -> None:
        super().__init__(config)

    def generate(self, dataset: GeneratorInput) -> datasets.Dataset:
        """Return a one-row dataset holding row 0 (no rows if the dataset is empty)."""
        rows = rows_of(dataset)
        # verl's mock raises IndexError on an empty dataset; proposing nothing is the no-op.
        picked = rows.select(range(min(1, len(rows))))
        logger.info("MockDataGenerator: re-proposing row 0 of %d rows", len(rows))
        return picked
