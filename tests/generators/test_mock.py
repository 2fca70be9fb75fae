"""MockDataGenerator passes the generator contract and re-proposes row 0."""

from __future__ import annotations

import datasets
from omegaconf import OmegaConf

from dyngen.generators import MockDataGenerator
from tests.generators.contract import GeneratorContract, VerlStyleDataset


class TestMockDataGenerator(GeneratorContract):
    def make_generator(self) -> MockDataGenerator:
        return MockDataGenerator()

    def test_returns_exactly_row_zero(self, seed_dataset: datasets.Dataset) -> None:
        new_rows = MockDataGenerator().generate(seed_dataset)
        assert new_rows.to_list() == [seed_dataset[0]]

    def test_returns_row_zero_of_verl_wrapper(self, seed_dataset: datasets.Dataset) -> None:
        new_rows = MockDataGenerator().generate(VerlStyleDataset(seed_dataset))
        assert new_rows.to_list() == [seed_dataset[0]]

    def test_empty_dataset_yields_no_rows(self, seed_dataset: datasets.Dataset) -> None:
        empty = seed_dataset.select([])
        assert len(MockDataGenerator().generate(empty)) == 0

    def test_keeps_config(self) -> None:
        config = OmegaConf.create({"path": "pkg://dyngen.generators.base",
                                    "name": "MockDataGenerator"})
        assert MockDataGenerator(config).config is config
        assert MockDataGenerator().config is None
