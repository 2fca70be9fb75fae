"""Reading the config's sources: the YAML file and verl/Hydra-style dotlist overrides."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from dyngen.config.messages import (
    describe,
    first_line,
    schema_type,
    wrap,
    yaml_error_message,
)
from dyngen.errors import ConfigError


def read_yaml(path: Path) -> DictConfig:
    """Load a YAML config file whose top level is a mapping."""
    where = f"config file {path}"
    if not path.is_file():
        found = "a directory" if path.is_dir() else "nothing at that path"
        raise ConfigError(
            f"{where}: expected an existing YAML file, found {found}. "
            "Check the path, or load no file to use the defaults."
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"{where}: expected a readable UTF-8 YAML file, found {exc}. Fix the file."
        ) from exc
    try:
        loaded = OmegaConf.create(text)
    except yaml.YAMLError as exc:
        raise ConfigError(yaml_error_message(where, text, exc)) from exc
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{where}: expected a valid config, found: {first_line(exc)}.") from exc
    if not isinstance(loaded, DictConfig):
        raise ConfigError(
            f"{where}: expected a mapping with sections store, data and round at the top "
            f"level, found {describe(OmegaConf.to_container(loaded))}. "
            "Write the file as `section:` blocks, e.g. `data:` then `  max_prompt_length: 512`."
        )
    return loaded


def parse_override(text: str) -> tuple[str, Any]:
    """Split a verl/Hydra-style ``[+|++]key=value`` override into key and parsed value."""
    if isinstance(text, str) and text.strip().startswith("~"):
        raise ConfigError(
            f"override {text!r}: expected key=value, found a deletion ('~'), which dyngen "
            "does not support. Set the key to a value instead."
        )
    if not isinstance(text, str) or "=" not in text:
        raise ConfigError(
            f"override {text!r}: expected key=value (e.g. data.max_prompt_length=512), "
            "found no '='. Write the override as section.key=value."
        )
    key, raw = text.split("=", 1)
    key = key.strip()
    # Hydra's "+" (add) and "++" (add or override) prefixes: keys are checked by schema anyway.
    key = key.lstrip("+")
    if not key or any(not part.strip() for part in key.split(".")):
        raise ConfigError(
            f"override {text!r}: expected a dotted key such as data.max_prompt_length, "
            f"found {key!r}. Write the override as section.key=value."
        )
    try:
        # Parse the value exactly as OmegaConf's dotlist does (YAML scalars, lists, dicts).
        value = OmegaConf.to_container(OmegaConf.from_dotlist([f"value={raw}"]))["value"]
    except (yaml.YAMLError, OmegaConfBaseException) as exc:
        raise ConfigError(
            f"override {text!r}: expected a YAML value after '=', found {raw!r} which does "
            "not parse. Quote the value or fix its brackets."
        ) from exc
    return key, value


def nest(key: str, value: Any) -> dict[str, Any]:
    """Turn ``a.b.c`` and a value into ``{"a": {"b": {"c": value}}}``."""
    nested: Any = value
    for part in reversed(key.split(".")):
        nested = {part: nested}
    return nested


def apply_override(cfg: DictConfig, key: str, value: Any, source: str) -> None:
    """Set one override on cfg, merging mappings into sections and replacing anything else."""
    merge = isinstance(value, Mapping) and dataclasses.is_dataclass(schema_type(key))
    try:
        OmegaConf.update(cfg, key, value, merge=merge)
    except OmegaConfBaseException as exc:
        raise wrap(exc, source) from exc
