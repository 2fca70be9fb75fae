"""Behaviour every data generator must show; inherit GeneratorContract to run it."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import datasets
import pytest
from omegaconf import OmegaConf

from dyngen.generators.base import AbstractDataGenerator
from dyngen.round import call_generator, generator_lineage
from dyngen.round.context import RoundContext, Trigger

VERL_COLUMNS = ("data_source", "prompt", "ability", "reward_model", "extra_info")


def make_seed_dataset(num_rows: int = 8) -> datasets.Dataset:
    """Build a small dataset in verl's RL parquet schema, like verl's gsm8k preprocessing."""
    return datasets.Dataset.from_list(
        [
            {
                "data_source": "openai/gsm8k",
                "prompt": [{"role": "user", "content": f"What is {i} + {i}? Think step by step."}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
                "extra_info": {"index": i},
            }
            for i in range(num_rows)
        ]
    )


class VerlStyleDataset:
    """Stands in for verl's RLHFDataset: rows only reachable through ``.dataframe``."""

    # Deliberately no __getitem__/select: RLHFDataset's items are tokenized tensors,
    # so a generator that reads the wrapper instead of .dataframe must fail here.
    def __init__(self, dataframe: datasets.Dataset) -> None:
        self.dataframe = dataframe

    def __len__(self) -> int:
        return len(self.dataframe)


def assert_verl_row(row: dict[str, Any]) -> None:
    """Fail unless ``row`` fits verl's RL schema with a usable prompt."""
    missing = [column for column in VERL_COLUMNS if column not in row]
    assert not missing, f"row lacks verl columns {missing}: {row}"
    assert isinstance(row["data_source"], str) and row["data_source"]
    assert isinstance(row["ability"], str)
    prompt = row["prompt"]
    assert isinstance(prompt, list) and prompt, f"prompt must be a non-empty list: {prompt!r}"
    for message in prompt:
        assert isinstance(message, dict), f"prompt message must be a dict: {message!r}"
        assert isinstance(message.get("role"), str) and message["role"], message
        assert isinstance(message.get("content"), str) and message["content"], message
    reward_model = row["reward_model"]
    assert isinstance(reward_model, dict), f"reward_model must be a dict: {reward_model!r}"
    assert {"style", "ground_truth"} <= reward_model.keys(), reward_model
    assert isinstance(row["extra_info"], dict) and "index" in row["extra_info"], row["extra_info"]


def snapshot(dataset: datasets.Dataset) -> tuple[Any, ...]:
    """Capture everything a generator could change about a dataset in place."""
    return (dataset._fingerprint, dataset.format, dataset.features, dataset.to_list())


class GeneratorContract:
    """Contract suite: subclass as ``Test<Name>`` and implement ``make_generator``."""

    # Lower to 0 for a generator that may legitimately propose nothing from the seed rows.
    min_new_rows: int = 1

    def make_generator(self) -> AbstractDataGenerator:
        """Return the generator under test."""
        raise NotImplementedError("subclasses of GeneratorContract implement make_generator")

    @pytest.fixture
    def seed_dataset(self) -> datasets.Dataset:
        """The dataset handed to ``generate``; override for generators needing other rows."""
        return make_seed_dataset()

    @pytest.fixture
    def generator(self) -> AbstractDataGenerator:
        """The generator under test, built fresh for each test."""
        return self.make_generator()

    def test_is_abstract_data_generator(self, generator: AbstractDataGenerator) -> None:
        assert isinstance(generator, AbstractDataGenerator)

    def test_generate_returns_dataset(
        self, generator: AbstractDataGenerator, seed_dataset: datasets.Dataset
    ) -> None:
        new_rows = generator.generate(seed_dataset)
        assert isinstance(new_rows, datasets.Dataset)
        assert len(new_rows) >= self.min_new_rows

    def test_new_rows_have_verl_schema(
        self, generator: AbstractDataGenerator, seed_dataset: datasets.Dataset
    ) -> None:
        new_rows = generator.generate(seed_dataset)
        assert set(VERL_COLUMNS) <= set(new_rows.column_names)
        for row in new_rows:
            assert_verl_row(row)

    def test_new_rows_concatenate_with_seed(
        self, generator: AbstractDataGenerator, seed_dataset: datasets.Dataset
    ) -> None:
        # verl appends new rows with concatenate_datasets; the store needs the same fit.
        new_rows = generator.generate(seed_dataset)
        combined = datasets.concatenate_datasets([seed_dataset, new_rows])
        assert len(combined) == len(seed_dataset) + len(new_rows)

    def test_does_not_mutate_input(
        self, generator: AbstractDataGenerator, seed_dataset: datasets.Dataset
    ) -> None:
        before = snapshot(seed_dataset)
        generator.generate(seed_dataset)
        assert snapshot(seed_dataset) == before

    def test_accepts_verl_style_wrapper(
        self, generator: AbstractDataGenerator, seed_dataset: datasets.Dataset
    ) -> None:
        wrapper = VerlStyleDataset(seed_dataset)
        before = snapshot(seed_dataset)
        new_rows = generator.generate(wrapper)
        assert isinstance(new_rows, datasets.Dataset)
        assert len(new_rows) >= self.min_new_rows
        for row in new_rows:
            assert_verl_row(row)
        # verl's DynamicGenDataset appends the result itself; a generator must not.
        assert wrapper.dataframe is seed_dataset
        assert snapshot(seed_dataset) == before

    def test_state_and_stats_round_trip_through_lineage(
        self, generator: AbstractDataGenerator, seed_dataset: datasets.Dataset
    ) -> None:
        # As the round does it: generate, record state and stats as JSON in the lineage,
        # then hand the state to a fresh generator (a new process) in the next round.
        context = RoundContext("contract", round=1, parent=0, trigger=Trigger(step=1))
        call_generator(generator, seed_dataset, context)
        lineage = generator_lineage(OmegaConf.create({"path": "pkg://contract"}), generator)
        for attr in ("state", "stats"):
            value = getattr(generator, attr)
            assert value is None or isinstance(value, dict), f"{attr} must be a dict or None"
            if value is not None:
                # Nothing is lost on the way to the version record.
                assert lineage[attr] == json.loads(json.dumps(value)) == value
        fresh = self.make_generator()
        later = replace(context, round=2, parent=1, trigger=Trigger(step=2),
                        previous_state=lineage.get("state"))
        new_rows = call_generator(fresh, seed_dataset, later)
        assert len(new_rows) >= self.min_new_rows
        for row in new_rows:
            assert_verl_row(row)
