"""Before any work: what makes every round fail alike, found once, with dyngen's message.

A round that cannot start (an invalid config, a generator or filter that cannot be found or
loaded) would fail the same way at each retry and each batch end. Whoever is about to run
rounds (an inline trainer dataset, a command) calls `check_before_start` first, so the user
reads the one-line message at once instead of a log line per batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig

from dyngen.config import tokenizer_path, validate
from dyngen.filters.base import RowFilter
from dyngen.generators.loader import load_generator_class
from dyngen.plugins import load_class


def check_before_start(config: DictConfig | Mapping[str, Any] | None) -> None:
    """Validate `config` and load its generator and filter classes; raise dyngen's errors.

    Raises `ConfigError` for an invalid config and a `GeneratorError` (not found, failed to
    import, wrong class) for a generator or user filter that cannot be loaded. Builds
    nothing: a generator's model or a tokenizer is loaded by the round.
    """
    cfg = validate(config if config is not None else {})
    tokenizer_path(cfg)  # over-long prompts filtered with no tokenizer named
    load_generator_class(cfg.data.datagen.path, cfg.data.datagen.name)
    for i, entry in enumerate(cfg.round.filters):
        load_class(entry.path, entry.name, RowFilter, key=f"round.filters[{i}]", kind="filter")
