"""Checking a config: keys and shapes before a merge, then values and ranges after it."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from dyngen.config.messages import describe, type_error, type_words, unknown_key, wrap
from dyngen.config.schema import MIRROR_FORMATS, OPEN_SECTIONS, TASK_RUNNER_KINDS, DyngenConfig
from dyngen.errors import ConfigError


def merge(base: DictConfig, other: DictConfig | Mapping[str, Any], source: str) -> DictConfig:
    """Merge other onto base after checking its keys and shapes; wrap OmegaConf errors."""
    try:
        plain = OmegaConf.to_container(other) if OmegaConf.is_config(other) else other
        check_shape(plain, DyngenConfig, "", source)
        merged = OmegaConf.merge(base, other)
    except OmegaConfBaseException as exc:
        raise wrap(exc, source) from exc
    return typing.cast(DictConfig, merged)


def check_shape(value: Any, cls: type, prefix: str, source: str) -> None:
    """Reject unknown keys and sections/lists/values in the wrong place, with a suggestion."""
    if not isinstance(value, Mapping):
        raise type_error(prefix.rstrip(".") or "config", type_words(cls), value, source)
    hints = typing.get_type_hints(cls)
    for key, item in value.items():
        full = f"{prefix}{key}"
        if key not in hints:
            if prefix.rstrip(".") in OPEN_SECTIONS:
                continue
            raise unknown_key(full, prefix, list(hints), source)
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            check_shape(item, tp, f"{full}.", source)
        elif typing.get_origin(tp) is dict and not isinstance(item, (Mapping, str)):
            raise type_error(full, type_words(tp), item, source)
        elif typing.get_origin(tp) is list:
            check_list(full, tp, item, source)
        elif typing.get_origin(tp) not in (dict, list) and isinstance(item, (Mapping, list)):
            raise type_error(full, type_words(tp), item, source)
        elif tp is bool and isinstance(item, (int, float)) and not isinstance(item, bool):
            # OmegaConf would read any number as a boolean; 5 is far more likely a mistake.
            raise type_error(full, type_words(tp), item, source)


def check_list(full: str, tp: Any, item: Any, source: str) -> None:
    """Check a list field holds mappings or strings, as declared (interpolations pass)."""
    if isinstance(item, str):
        return
    if not isinstance(item, list):
        raise type_error(full, type_words(tp), item, source)
    of_text = typing.get_args(tp) == (str,)
    of_numbers = typing.get_args(tp) == (float,)
    for index, entry in enumerate(item):
        if of_numbers:
            if isinstance(entry, bool) or not isinstance(entry, (int, float, str)):
                raise type_error(f"{full}[{index}]", "a number", entry, source)
            continue
        if of_text and not isinstance(entry, str):
            raise type_error(f"{full}[{index}]", "a string", entry, source)
        if not of_text and not isinstance(entry, Mapping):
            raise type_error(f"{full}[{index}]", "a mapping with path and name", entry, source)


def check_resolvable(cfg: DictConfig) -> None:
    """Resolve every interpolation once so a broken ``${...}`` fails here, not mid-round."""
    try:
        OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as exc:
        raise wrap(exc, "merged config") from exc


def non_empty(value: Any) -> bool:
    """Tell whether value is a string with something other than whitespace."""
    return isinstance(value, str) and bool(value.strip())


# key, check, what is expected, an example override that fixes it
RANGE_CHECKS: tuple[tuple[str, Callable[[Any], bool], str, str], ...] = (
    ("store.root", non_empty, "a non-empty directory path or URL", "store.root=dyngen_store"),
    (
        "store.cache_dir",
        lambda v: v is None or non_empty(v),
        "null or a local folder for cached shards",
        "store.cache_dir=/tmp/dyngen-cache",
    ),
    ("data.prompt_key", non_empty, "a non-empty column name", "data.prompt_key=prompt"),
    (
        "data.max_prompt_length",
        lambda v: v > 0,
        "a positive integer (tokens)",
        "data.max_prompt_length=512",
    ),
    (
        "data.tokenizer",
        lambda v: v is None or non_empty(v),
        "null or a path to a local tokenizer folder",
        "data.tokenizer=/path/to/model",
    ),
    (
        "data.datagen.path",
        non_empty,
        "a generator location (a file path, file://… or pkg://module)",
        "data.datagen.path=pkg://dyngen.generators.base",
    ),
    (
        "data.datagen.name",
        non_empty,
        "a generator class name",
        "data.datagen.name=MockDataGenerator",
    ),
    ("round.retries", lambda v: v >= 0, "an integer >= 0", "round.retries=2"),
    (
        "round.retry_delay_seconds",
        lambda v: v >= 0,
        "a number >= 0",
        "round.retry_delay_seconds=2.0",
    ),
    ("round.timeout_seconds", lambda v: v > 0, "a number > 0", "round.timeout_seconds=600"),
    ("round.partitions", lambda v: v >= 1, "an integer >= 1", "round.partitions=4"),
    (
        "round.task_runner.kind",
        lambda v: v in TASK_RUNNER_KINDS,
        f"one of {', '.join(TASK_RUNNER_KINDS)}",
        "round.task_runner.kind=ray",
    ),
    (
        "round.max_rollouts_bytes",
        lambda v: v > 0,
        "a positive integer (bytes)",
        "round.max_rollouts_bytes=67108864",
    ),
    ("round.compaction.max_small_shards", lambda v: v >= 0, "an integer >= 0",
     "round.compaction.max_small_shards=50"),
    ("round.compaction.fan_in", lambda v: v >= 2, "an integer >= 2", "round.compaction.fan_in=8"),
    ("round.compaction.target_shard_mb", lambda v: v > 0, "a number > 0 (MiB)",
     "round.compaction.target_shard_mb=128"),
    ("round.near_duplicate.threshold", lambda v: 0 < v <= 1, "a number in (0, 1]",
     "round.near_duplicate.threshold=0.8"),
    ("round.near_duplicate.num_perm", lambda v: v >= 1, "an integer >= 1",
     "round.near_duplicate.num_perm=128"),
    ("round.near_duplicate.bands", lambda v: v >= 1, "an integer >= 1",
     "round.near_duplicate.bands=16"),
    ("round.near_duplicate.ngram", lambda v: v >= 1, "an integer >= 1",
     "round.near_duplicate.ngram=5"),
    ("round.near_duplicate.min_words", lambda v: v >= 0, "an integer >= 0",
     "round.near_duplicate.min_words=10"),
    ("round.semantic_duplicate.same_answer_threshold", lambda v: 0 < v <= 1,
     "a cosine in (0, 1]", "round.semantic_duplicate.same_answer_threshold=0.6"),
    ("mirror.format", lambda v: v in MIRROR_FORMATS, f"one of {', '.join(MIRROR_FORMATS)}",
     "mirror.format=delta"),
    ("mirror.dest", lambda v: v is None or non_empty(v),
     "null (no mirror) or a folder or URL under which each dataset is mirrored",
     "mirror.dest=s3://bucket/mirrors"),
)


def check_ranges(cfg: DictConfig) -> None:
    """Check values that have the right type but an impossible value."""
    for key, ok, expected, example in RANGE_CHECKS:
        value = OmegaConf.select(cfg, key)
        if not ok(value):
            raise ConfigError(
                f"{key}: expected {expected}, found {describe(value)}. Set it, e.g. {example}."
            )
    for index, folder in enumerate(cfg.round.rollouts_dirs):
        if not non_empty(folder):
            raise ConfigError(
                f"round.rollouts_dirs[{index}]: expected a folder path, found "
                f"{describe(folder)}. List the folders rollouts files may be read from, e.g. "
                "round.rollouts_dirs=[/data/rollouts]."
            )
    for index, entry in enumerate(cfg.round.filters):
        for part in ("path", "name"):
            value = entry.get(part)
            if not non_empty(value):
                raise ConfigError(
                    f"round.filters[{index}].{part}: expected a non-empty string, found "
                    f"{describe(value)}. Give each filter a path (file or pkg://module) "
                    "and a class name, e.g. {path: pkg://my_filters, name: MyFilter}."
                )
    check_solve_rate(cfg.round.solve_rate)
    check_difficulty(cfg.round.difficulty)
    check_top_up(cfg.round.top_up)
    near = cfg.round.near_duplicate
    if near.num_perm % near.bands:
        raise ConfigError(
            f"round.near_duplicate.num_perm: expected a multiple of round.near_duplicate.bands "
            f"({near.bands}), each band taking num_perm / bands values; found {near.num_perm}. "
            f"Set e.g. round.near_duplicate.num_perm={near.bands * 8}.")
    runner = cfg.round.task_runner
    for key in ("address", "init_kwargs", "remote_options"):
        if runner.kind != "ray" and runner[key]:
            raise ConfigError(
                f"round.task_runner.{key}: applies only to round.task_runner.kind=ray, found "
                f"{describe(runner[key])} with kind {runner.kind!r}. Set "
                f"round.task_runner.kind=ray, or remove round.task_runner.{key}."
            )


def check_solve_rate(sr: DictConfig) -> None:
    """round.solve_rate: a band inside [0, 1], whole samples, and a policy when enabled."""
    key = "round.solve_rate"
    for name, ok, expected, example in (
            ("samples", lambda v: v >= 1, "an integer >= 1", "samples=8"),
            ("temperature", lambda v: v >= 0, "a number >= 0", "temperature=1.0"),
            ("max_tokens", lambda v: v >= 1, "an integer >= 1", "max_tokens=512"),
            ("max_concurrency", lambda v: v >= 1, "an integer >= 1", "max_concurrency=16"),
            ("max_retries", lambda v: v >= 0, "an integer >= 0", "max_retries=3"),
            ("request_timeout_seconds", lambda v: v is None or v > 0,
             "null or a number of seconds > 0", "request_timeout_seconds=120")):
        if not ok(sr[name]):
            raise ConfigError(f"{key}.{name}: expected {expected}, found {describe(sr[name])}. "
                              f"Set it, e.g. {key}.{example}.")
    check_sequential(sr.sequential, f"{key}.sequential")
    band = list(sr.keep)
    if len(band) != 2 or not 0 <= float(band[0]) <= float(band[1]) <= 1:
        raise ConfigError(
            f"{key}.keep: expected [low, high] with 0 <= low <= high <= 1 (the pass rates "
            f"kept, both ends included), found {describe(band)}. Set it, e.g. "
            f"{key}.keep=[0.125,0.875].")
    if sr.reward.path is not None and not non_empty(sr.reward.path):
        raise ConfigError(f"{key}.reward.path: expected null (dyngen's own reward for its "
                          f"generators' rows) or a .py file or pkg://module, found "
                          f"{describe(sr.reward.path)}.")
    if not non_empty(sr.reward.name):
        raise ConfigError(f"{key}.reward.name: expected the reward function's name, found "
                          f"{describe(sr.reward.name)}. Set {key}.reward.name=compute_score.")
    if sr.enabled and not sr.endpoint and not sr.model_path:
        raise ConfigError(
            f"{key}.enabled is true but no policy is named: expected {key}.endpoint (the "
            f"policy's OpenAI-compatible base URL, e.g. http://policy-host:8000/v1) or "
            f"{key}.model_path (an in-process model), found neither. Set one, or "
            f"{key}.enabled=false.")


def check_difficulty(d: DictConfig) -> None:
    """round.difficulty: a positive half-life, whole counts, shares inside [0, 1]."""
    key = "round.difficulty"
    for name, ok, expected, example in (
            ("half_life_steps", lambda v: v > 0, "a number of steps > 0", "half_life_steps=4"),
            ("retire_min_samples", lambda v: v >= 1, "an integer >= 1", "retire_min_samples=16"),
            ("retire_window_steps", lambda v: v >= 0, "an integer >= 0",
             "retire_window_steps=8"),
            ("revive_rise", lambda v: 0 <= v <= 1, "a pass-rate rise in [0, 1]",
             "revive_rise=0.25"),
            ("broken_reward_min_groups", lambda v: v >= 1, "an integer >= 1",
             "broken_reward_min_groups=8"),
            ("broken_reward_share", lambda v: 0 < v <= 1, "a share in (0, 1]",
             "broken_reward_share=0.95")):
        if not ok(d[name]):
            raise ConfigError(f"{key}.{name}: expected {expected}, found {describe(d[name])}. "
                              f"Set it, e.g. {key}.{example}.")


def check_top_up(t: DictConfig) -> None:
    """round.top_up: a minimum of rows >= 0 (or null), at least one generator call."""
    key = "round.top_up"
    if t.min_rows is not None and t.min_rows < 0:
        raise ConfigError(f"{key}.min_rows: expected an integer >= 0 or null (what the "
                          f"trainer states), found {describe(t.min_rows)}. Set it, e.g. "
                          f"{key}.min_rows=8.")
    if t.max_attempts < 1:
        raise ConfigError(f"{key}.max_attempts: expected an integer >= 1 (generator calls "
                          f"in all; 1 never asks again), found {describe(t.max_attempts)}. "
                          f"Set it, e.g. {key}.max_attempts=3.")


def check_sequential(seq: DictConfig, key: str) -> None:
    """round.solve_rate.sequential: whole stage sizes >= 1, first <= cap, 0 < confidence < 1."""
    for name, example in (("first", 4), ("step", 8), ("cap", 32)):
        if seq[name] < 1:
            raise ConfigError(f"{key}.{name}: expected an integer >= 1 (completions per row), "
                              f"found {describe(seq[name])}. Set it, e.g. {key}.{name}={example}.")
    if seq.first > seq.cap:
        raise ConfigError(
            f"{key}.first: expected at most {key}.cap ({seq.cap}), the most samples a row "
            f"gets; found {seq.first}. Raise {key}.cap or lower {key}.first, e.g. "
            f"{key}.first=4 {key}.cap=32.")
    if not 0 < seq.confidence < 1:
        raise ConfigError(
            f"{key}.confidence: expected a probability strictly between 0 and 1 (the "
            f"posterior mass on a verdict's side that decides a row), found "
            f"{describe(seq.confidence)}. Set it, e.g. {key}.confidence=0.9.")
