"""The generator contract kept from verl's DynamicGenDataset, and its no-op mock."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import Protocol, runtime_checkable

import datasets
from omegaconf import DictConfig

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

    A generator that needs memory across rounds sets ``self.state`` (a JSON-able dict) in
    ``generate``; the round records it in the version's lineage and hands it back as
    ``context.previous_state`` next time, in this process or after a restart.
    """

    def __init__(self, config: DictConfig | None) -> None:
        self.config = config

    @abstractmethod
    def generate(self, dataset: GeneratorInput) -> datasets.Dataset:
        """Return only the NEW rows, in verl's schema; never modify ``dataset``."""


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
