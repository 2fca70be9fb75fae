"""Check everything a round's config names before anything starts.

`dyngen round`, `dyngen serve` (at start-up) and the generation round's first step call
`check_before_start`: it loads the generator class, checks the keys under `data.datagen`
against the generator's own `defaults`, loads every `round.filters` class and looks for
the tokenizer folder, all in this process and in well under a second, so a mistake is
reported before a Prefect server starts or a flow run is created. Nothing is built: a
generator's `__init__` may load a model, which is the round's work.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from dyngen.errors import ConfigError, DatasetNotFoundError

# Keys every data.datagen section has (dyngen.generators.base.LOCATION_KEYS).
LOCATION_KEYS = ("path", "name")


def check_before_start(config: DictConfig | Mapping[str, Any] | None,
                       dataset: str | None = None) -> None:
    """Fail with one clear ConfigError/GeneratorError if the config names what cannot run.

    `config` is a round's config (a DictConfig or the plain `round_params` mapping);
    `dataset`, when given, must exist in the config's store.
    """
    from dyngen.config import load_config

    cfg = config if isinstance(config, DictConfig) else load_config(base=config)
    datagen = cfg.data.datagen
    given = _plain(datagen)
    misspelt = misspelt_location_keys(given)
    if misspelt:  # first: the typo left path or name at its default, so the load would fail
        raise ConfigError(_misspelt_message(misspelt, given))
    cls = _generator_class(str(datagen.path), str(datagen.name))
    check_generator_keys(cls, given)
    check_filters(cfg)
    check_tokenizer(cfg)
    if dataset is not None:
        check_dataset(cfg, dataset)


def misspelt_location_keys(given: Mapping[str, Any]) -> dict[str, str]:
    """Keys of data.datagen one edit away from `path` or `name` holding what that key holds
    (a generator location, a class name): the key each stands for. A generator's own key
    that happens to be spelt close (`math: 3`) is left alone."""
    out = {}
    for key, value in given.items():
        if key in LOCATION_KEYS or not isinstance(key, str) or not isinstance(value, str):
            continue
        for location in LOCATION_KEYS:
            if one_edit_apart(key, location) and _looks_like(location, value):
                out[key] = location
    return out


def _looks_like(location: str, value: str) -> bool:
    """Whether `value` reads as a data.datagen.path (a .py file, pkg://, file://) or name."""
    if location == "path":
        return value.endswith(".py") or value.startswith(("pkg://", "file://"))
    return value.isidentifier()


def one_edit_apart(a: str, b: str) -> bool:
    """Whether `a` becomes `b` by one insertion, deletion, substitution or swap of neighbours."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        diff = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
        return len(diff) == 1 or (len(diff) == 2 and diff[1] == diff[0] + 1
                                  and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]])
    short, long = sorted((a, b), key=len)
    return any(long[:i] + long[i + 1:] == short for i in range(len(long)))


def _misspelt_message(misspelt: dict[str, str], given: Mapping[str, Any]) -> str:
    key, meant = next(iter(misspelt.items()))
    return (f"unknown key data.datagen.{key}: expected data.datagen.{meant} (the generator's "
            f"{'class' if meant == 'name' else 'location'}), found data.datagen.{key}="
            f"{given[key]!r}, so data.datagen.{meant} kept its value. Did you mean "
            f"data.datagen.{meant}={given[key]}?")


def _generator_class(path: str, name: str) -> type:
    from dyngen.generators.loader import load_generator_class

    return load_generator_class(path, name)


def check_generator_keys(cls: type, given: Mapping[str, Any]) -> dict[str, Any]:
    """The generator's settings from data.datagen over its `defaults` (unknown keys refused)."""
    from dyngen.generators.base import checked_settings

    return checked_settings(given, getattr(cls, "defaults", None), cls.__name__)


def check_filters(cfg: DictConfig) -> None:
    """Load every `round.filters` class (path, name), as the round's filter stage will."""
    from dyngen.filters.base import RowFilter
    from dyngen.plugins import load_class

    for i, entry in enumerate(cfg.round.filters):
        load_class(str(entry.path), str(entry.name), RowFilter, key=f"round.filters[{i}]",
                   kind="filter")


def check_tokenizer(cfg: DictConfig) -> None:
    """With over-long prompts filtered, `data.tokenizer` is set and a local folder or file."""
    from dyngen.config import tokenizer_path

    path = tokenizer_path(cfg)
    if path is not None and not Path(path).expanduser().exists():
        raise ConfigError(f"data.tokenizer: expected a local tokenizer folder (over-long "
                          f"prompts are filtered), found {path!r}, which does not exist. Set "
                          "data.tokenizer=/path/to/model, or data.filter_overlong_prompts=false.")


def check_dataset(cfg: DictConfig, dataset: str) -> None:
    """The dataset has a committed version in the config's store (else: did you mean)."""
    from dyngen.store import Store
    from dyngen.store.location import store_settings
    from dyngen.store.names import validate_name

    validate_name(dataset)
    store = Store.from_config(store_settings(cfg.store))
    try:
        store.head(dataset)
    except DatasetNotFoundError as exc:
        exc.store = store  # type: ignore[attr-defined]  # the CLI suggests a close name
        raise


def _plain(node: Any) -> dict[str, Any]:
    value = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
    return dict(value or {})
