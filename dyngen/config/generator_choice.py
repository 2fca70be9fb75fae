"""Whether a deployment's config names its generator (`data.datagen.path`).

The schema's default generator is `MockDataGenerator`, which re-proposes a dataset's first
row: fine for a round run by hand to try the plumbing, wrong for a deployment that grows a
dataset while a model trains. A deployment (`prefect.yaml`, `dyngen serve`) must name its
generator; its rounds fail at once otherwise, instead of quietly running the mock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from dyngen.config.reading import nest, parse_override, read_yaml
from dyngen.errors import ConfigError

WHERE_TO_SET = (
    "Name it where the deployment is defined: in prefect.yaml, under the deployment's "
    "parameters.config.data.datagen (path and name, e.g. path: "
    "pkg://dyngen.generators.arithmetic and name: ArithmeticCurriculum), then run "
    "`prefect deploy --all` again; for `dyngen serve`, pass data.datagen.path=... "
    "data.datagen.name=... or a --config file that sets them. A deployment never falls "
    "back to MockDataGenerator: to run the mock, name it (path: "
    "pkg://dyngen.generators.base, name: MockDataGenerator).")


def names_generator(config: Mapping[str, Any] | DictConfig | None = None,
                    overrides: Sequence[str] = (), path: str | Path | None = None) -> bool:
    """Whether the config, the YAML file at `path` or an override sets data.datagen.path."""
    sources: list[Any] = [config, read_yaml(Path(path)) if path is not None else None]
    for text in overrides:
        key, value = parse_override(text)
        sources.append(nest(key, value))
    return any(_datagen_path(source) for source in sources)


def require_generator(config: Mapping[str, Any] | DictConfig | None = None,
                      overrides: Sequence[str] = (), path: str | Path | None = None,
                      what: str = "this deployment's config") -> None:
    """Fail unless the config names its generator (data.datagen.path)."""
    if not names_generator(config, overrides, path):
        raise ConfigError(f"{what}: expected data.datagen.path naming the generator the rounds "
                          f"run, found none. {WHERE_TO_SET}")


def _datagen_path(source: Any) -> bool:
    if isinstance(source, DictConfig):
        source = OmegaConf.to_container(source)
    data = source.get("data") if isinstance(source, Mapping) else None
    datagen = data.get("datagen") if isinstance(data, Mapping) else None
    found = datagen.get("path") if isinstance(datagen, Mapping) else None
    return isinstance(found, str) and bool(found.strip())
