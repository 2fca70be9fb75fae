"""A generator's own config keys: declared with their defaults, checked by the base class."""

from __future__ import annotations

import datasets
import pytest
from omegaconf import OmegaConf

from dyngen.errors import ConfigError
from dyngen.generators.arithmetic import ArithmeticCurriculum
from dyngen.generators.base import AbstractDataGenerator, MockDataGenerator


class Counting(AbstractDataGenerator):
    defaults = {"n": 3, "rate": 0.5, "label": "x", "enabled": True, "extra": None}

    def generate(self, dataset, context=None) -> datasets.Dataset:
        return datasets.Dataset.from_list([])


def test_settings_are_the_config_over_the_defaults() -> None:
    cfg = OmegaConf.create({"path": "pkg://mine", "name": "Counting", "n": 5, "rate": 1})
    assert Counting(cfg).settings() == {"n": 5, "rate": 1, "label": "x", "enabled": True,
                                        "extra": None}


def test_an_unknown_key_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"unknown keys \['nn'\] for Counting; expected "
                                          r"some of \['enabled', 'extra', 'label', 'n', 'rate'\]"):
        Counting({"nn": 5}).settings()


@pytest.mark.parametrize(("key", "value", "expected"), [
    ("n", "5", "an integer"), ("n", 2.5, "an integer"), ("n", True, "an integer"),
    ("rate", "fast", "a number"), ("enabled", 1, "true or false"), ("label", 3, "a str"),
])
def test_a_value_of_another_type_than_its_default_is_refused(key, value, expected) -> None:
    with pytest.raises(ConfigError, match=rf"data.datagen.{key}: expected {expected} for "
                                          rf"Counting, found {value!r}"):
        Counting({key: value}).settings()


def test_a_generator_without_defaults_reads_its_config_as_given() -> None:
    assert MockDataGenerator({"anything": 1}).settings() == {"anything": 1}


def test_built_in_generators_declare_their_keys() -> None:
    with pytest.raises(ConfigError, match="unknown keys"):
        ArithmeticCurriculum({"tasks_per_rnd": 4}).generate(datasets.Dataset.from_list([]))
