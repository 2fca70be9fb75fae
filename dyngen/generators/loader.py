"""Find the generator class named by ``data.datagen.path`` and ``data.datagen.name``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from dyngen.errors import GeneratorError
from dyngen.generators.base import AbstractDataGenerator
from dyngen.plugins import FILE_PREFIX, PKG_PREFIX, load_class, qualified_name

__all__ = ["BASE_CLASS", "FILE_PREFIX", "PKG_PREFIX", "build_generator", "load_generator_class"]

BASE_CLASS = qualified_name(AbstractDataGenerator)


def load_generator_class(path: str, name: str) -> type[AbstractDataGenerator]:
    """Import ``path`` and return its ``AbstractDataGenerator`` subclass called ``name``."""
    return load_class(path, name, AbstractDataGenerator, key="data.datagen", kind="generator")


def build_generator(
    datagen_config: DictConfig | Mapping[str, Any] | None,
) -> AbstractDataGenerator:
    """Load the class named by the ``datagen`` subtree and build it with that subtree."""
    if datagen_config is None:
        raise GeneratorError("data.datagen must be set, with keys 'path' and 'name'.")
    config = (
        datagen_config
        if isinstance(datagen_config, DictConfig)
        else OmegaConf.create(dict(datagen_config))
    )
    # select() yields None for absent keys and '???' alike, so both hit the "must be set" error.
    path = OmegaConf.select(config, "path", default=None)
    name = OmegaConf.select(config, "name", default=None)
    cls = load_generator_class(path, name)
    # Same call verl makes (cls(config.datagen)), so verl generators build unchanged.
    return cls(config)
