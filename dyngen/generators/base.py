"""The generator contract kept from verl's DynamicGenDataset, and its no-op mock."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from omegaconf import DictConfig, OmegaConf

from dyngen.errors import ConfigError
from dyngen.text import did_you_mean

if TYPE_CHECKING:  # loading a generator class (a config check) imports neither
    import datasets

    from dyngen.round.context import RoundContext

logger = logging.getLogger(__name__)


@runtime_checkable
class HasDataframe(Protocol):
    """A verl-style dataset (e.g. RLHFDataset) whose raw rows live in ``.dataframe``."""

    dataframe: datasets.Dataset


if TYPE_CHECKING:
    GeneratorInput = datasets.Dataset | HasDataframe
else:
    GeneratorInput = Any


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
    ``stats`` (a few counts, e.g. proposed / kept / dropped by reason). A generator that
    refuses rows it made may set ``rejected`` to ``[{"reason", "detail", "row"}, ...]``:
    the round quarantines them beside the filters' rejections, so none is lost.
    """

    state: dict[str, Any] | None = None
    stats: dict[str, Any] | None = None
    rejected: list[dict[str, Any]] | None = None
    # Set by the round before `generate`, for generators written before `context=`.
    round_context: RoundContext | None = None

    # The generator's own keys under data.datagen, with their defaults; `settings()`
    # refuses any other key (a typo) and a value of another type than its default's.
    # None: the generator reads `self.config` itself (verl's generators do).
    defaults: ClassVar[Mapping[str, Any] | None] = None

    def __init__(self, config: DictConfig | None) -> None:
        self.config = config

    def settings(self) -> dict[str, Any]:
        """`self.config` over `defaults`, each key and type checked, then `check_settings`."""
        return self.check_settings(checked_settings(self.config, self.defaults,
                                                    type(self).__name__))

    def check_settings(self, settings: dict[str, Any]) -> dict[str, Any]:
        """Check what a type cannot (ranges, choices) and return the settings; override."""
        return settings

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


# Keys every data.datagen section has: where the generator is and its class name.
LOCATION_KEYS = frozenset({"path", "name"})


def checked_settings(config: Mapping[str, Any] | None, defaults: Mapping[str, Any] | None,
                     generator: str) -> dict[str, Any]:
    """`config` (data.datagen) over `defaults`: unknown keys and mistyped values refused."""
    given = OmegaConf.to_container(config, resolve=True) if OmegaConf.is_config(config) \
        else dict(config or {})
    assert isinstance(given, dict)
    if defaults is None:
        return given
    unknown = sorted(set(given) - set(defaults) - LOCATION_KEYS)
    if unknown:
        known = [f"data.datagen.{k}" for k in sorted(set(defaults) | LOCATION_KEYS)]
        hint = did_you_mean(f"data.datagen.{unknown[0]}", known, quote=False)
        hint = hint or " Remove them or fix their spelling."
        raise ConfigError(f"data.datagen has unknown keys {unknown} for {generator}; expected "
                          f"some of {sorted(defaults)}.{hint}")
    for key, value in given.items():
        if key in defaults and not _same_type(value, defaults[key]):
            raise ConfigError(f"data.datagen.{key}: expected {_type_words(defaults[key])} for "
                              f"{generator}, found {value!r}. Set it, e.g. "
                              f"data.datagen.{key}={defaults[key]!r}.")
    return {**defaults, **{k: v for k, v in given.items() if k not in LOCATION_KEYS}}


def _same_type(value: Any, default: Any) -> bool:
    """Whether `value` may stand where `default` does (an integer where a number is)."""
    if default is None:
        return True
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, (int, float)):
        ok = (int,) if isinstance(default, int) else (int, float)
        return isinstance(value, ok) and not isinstance(value, bool)
    if isinstance(default, (list, tuple)):
        return isinstance(value, (list, tuple))
    return isinstance(value, type(default))


def _type_words(default: Any) -> str:
    """A default's type in words."""
    if isinstance(default, bool):
        return "true or false"
    if isinstance(default, int):
        return "an integer"
    if isinstance(default, float):
        return "a number"
    if isinstance(default, (list, tuple)):
        return "a list"
    return f"a {type(default).__name__}"
