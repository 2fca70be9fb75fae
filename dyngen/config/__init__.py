"""dyngen's configuration: schema, defaults, YAML file, dotlist overrides and validation.

Keys under ``data:`` keep verl's names (``prompt_key``, ``max_prompt_length``,
``filter_overlong_prompts``, ``apply_chat_template_kwargs``, ``datagen.path``,
``datagen.name``) so a verl config fragment reads the same here. ``data.datagen``
is open: a generator receives the whole subtree and may define its own keys.
Every mistake a user can make surfaces as a :class:`~dyngen.errors.ConfigError`
that names the key, what was expected, what was found and what to do.

The package is split by job: `schema` (the sections and defaults), `reading` (file and
overrides), `checks` (shapes and ranges) and `messages` (the wording of every error).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from dyngen.config.checks import check_ranges, check_resolvable, check_shape, merge
from dyngen.config.messages import describe
from dyngen.config.reading import apply_override, nest, parse_override, read_yaml
from dyngen.config.schema import (
    TASK_RUNNER_KINDS,
    CompactionConfig,
    DataConfig,
    DatagenConfig,
    DyngenConfig,
    RoundConfig,
    StoreConfig,
    TaskRunnerConfig,
    default_config,
)
from dyngen.errors import ConfigError
from dyngen.store.location import absolute_root

__all__ = [
    "TASK_RUNNER_KINDS",
    "CompactionConfig",
    "DataConfig",
    "DatagenConfig",
    "DyngenConfig",
    "RoundConfig",
    "StoreConfig",
    "TaskRunnerConfig",
    "config_hash",
    "default_config",
    "load_config",
    "round_params",
    "tokenizer_path",
    "validate",
]


def load_config(path: str | Path | None = None, overrides: Sequence[str] = (),
                base: DictConfig | Mapping[str, Any] | None = None) -> DictConfig:
    """Build the config: defaults, `base`, the YAML file, then dotlist overrides; validated."""
    if isinstance(overrides, str):
        raise ConfigError(
            f"overrides: expected a list of key=value strings, found the single string "
            f"{overrides!r}. Pass it as [{overrides!r}]."
        )
    cfg = default_config()
    if base is not None:
        cfg = merge(cfg, base, "given config")
    if path is not None:
        source = f"config file {path}"
        cfg = merge(cfg, read_yaml(Path(path)), source)
    for text in overrides:
        key, value = parse_override(text)
        source = f"override {text!r}"
        check_shape(nest(key, value), DyngenConfig, "", source)
        apply_override(cfg, key, value, source)
    return validate(cfg)


def validate(cfg: DictConfig | Mapping[str, Any]) -> DictConfig:
    """Check keys, types and ranges; return a typed copy merged onto the defaults."""
    if not isinstance(cfg, (Mapping, DictConfig)):
        raise ConfigError(
            f"config: expected a mapping with sections store, data and round, "
            f"found {describe(cfg)}. Pass a DictConfig or a dict."
        )
    merged = merge(default_config(), cfg, "merged config")
    check_resolvable(merged)
    check_ranges(merged)
    return merged


def round_params(config: DictConfig | Mapping[str, Any] | None = None, *,
                 path: str | Path | None = None, overrides: Sequence[str] = (),
                 root: str | os.PathLike[str] | None = None,
                 rollouts_dirs: Iterable[str | os.PathLike[str]] = (),
                 absolute: bool = False) -> dict[str, Any]:
    """The generation round's `config` parameter: validated, resolved, plain data.

    `root` replaces store.root; `rollouts_dirs` are allowed besides round.rollouts_dirs;
    `absolute` makes the store root, those folders and the generator's and filters' file
    paths absolute (for runs started in another folder, as a served or deployed round is).
    The one builder every caller of the round uses.
    """
    if config is not None and not isinstance(config, (Mapping, DictConfig)):
        raise ConfigError(f"config: expected a mapping with sections store, data and round, "
                          f"found {type(config).__name__}. Pass a dict or an OmegaConf config.")
    cfg = load_config(path, overrides, base=config)
    if root is not None:
        cfg.store.root = str(root)
    extra = [str(folder) for folder in rollouts_dirs]
    if extra:
        cfg.round.rollouts_dirs = [*cfg.round.rollouts_dirs, *extra]
    if absolute:
        cfg.store.root = absolute_root(cfg.store.root)  # a URL stays as it is
        cfg.round.rollouts_dirs = _absolute_dirs(cfg.round.rollouts_dirs)
        cfg.data.datagen.path = _absolute_plugin_path(cfg.data.datagen.path)
        for entry in cfg.round.filters:
            entry.path = _absolute_plugin_path(entry.path)
    plain = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(plain, dict)
    return plain


def config_hash(cfg_node: Any) -> str:
    """Return a stable sha256 hex digest of a config subtree (resolved, keys sorted)."""
    value = (
        OmegaConf.to_container(cfg_node, resolve=True)
        if OmegaConf.is_config(cfg_node)
        else cfg_node
    )
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def tokenizer_path(cfg: DictConfig) -> str | None:
    """Return ``data.tokenizer`` when over-long prompts are filtered, else None; fail if unset."""
    if not cfg.data.filter_overlong_prompts:
        return None
    if cfg.data.tokenizer is None:
        raise ConfigError(
            "data.tokenizer: expected a path to a local tokenizer folder because "
            "data.filter_overlong_prompts is true, found null. Set data.tokenizer=/path/to/model "
            "or data.filter_overlong_prompts=false."
        )
    return cfg.data.tokenizer


def _absolute_plugin_path(path: Any) -> Any:
    """A plugin's file path (`x.py`, `file://x.py`) made absolute; `pkg://` paths stay."""
    if not isinstance(path, str) or not path or path.startswith("pkg://"):
        return path
    if path.startswith("file://"):
        return "file://" + os.path.abspath(os.path.expanduser(path[len("file://"):]))
    return os.path.abspath(os.path.expanduser(path))


def _absolute_dirs(dirs: Iterable[str]) -> list[str]:
    """Folders made absolute against the current directory (URLs left for the check)."""
    return [d if "://" in d else os.path.abspath(d) for d in map(str, dirs)]
