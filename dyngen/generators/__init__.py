"""Pluggable data generators: the contract, the mock, and the loader that finds them."""

from dyngen.generators.base import AbstractDataGenerator, MockDataGenerator
from dyngen.generators.loader import build_generator, load_generator_class

__all__ = [
    "AbstractDataGenerator",
    "MockDataGenerator",
    "build_generator",
    "load_generator_class",
]
