"""dyngen's configuration: schema, defaults, YAML file, dotlist overrides and validation.

Keys under ``data:`` keep verl's names (``prompt_key``, ``max_prompt_length``,
``filter_overlong_prompts``, ``apply_chat_template_kwargs``, ``datagen.path``,
``datagen.name``) so a verl config fragment reads the same here. ``data.datagen``
is open: a generator receives the whole subtree and may define its own keys.
Every mistake a user can make surfaces as a :class:`~dyngen.errors.ConfigError`
that names the key, what was expected, what was found and what to do.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import typing
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    InterpolationResolutionError,
    MissingMandatoryValue,
    OmegaConfBaseException,
    ValidationError,
)

from dyngen.errors import ConfigError
from dyngen.store.location import local_folder_for

__all__ = [
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
    "tokenizer_path",
    "validate",
]


@dataclass
class StoreConfig:
    """Where the versioned datasets live: a local folder (a relative root resolves against
    the CWD) or a URL (s3://, gs://, memory://; README: Storage backends)."""

    # DYNGEN_STORE_ROOT wins when set, so a worker or serve process can be pointed at a store.
    root: str = "${oc.env:DYNGEN_STORE_ROOT,dyngen_store}"
    # Passed to a URL root's fsspec filesystem (endpoint_url, profile, …). A config is
    # recorded with each flow run: leave secrets to the environment (AWS_*).
    storage_options: dict[str, Any] = field(default_factory=dict)
    # The user promises that one process writes the store: needed to commit on a backend
    # without an atomic create-if-absent.
    single_writer: bool = False
    # Local copies of a remote store's shards, to memory-map (default: $DYNGEN_CACHE_DIR,
    # else ~/.cache/dyngen/shards).
    cache_dir: str | None = None


@dataclass
class DatagenConfig:
    """The generator class (verl's ``data.datagen``); open to the generator's own keys."""

    path: str = "pkg://generators.base"
    name: str = "MockDataGenerator"


@dataclass
class DataConfig:
    """Dataset and prompt settings, named as in verl's ``data:`` section."""

    prompt_key: str = "prompt"
    # verl's defaults, so a verl user's config means the same here.
    max_prompt_length: int = 512
    filter_overlong_prompts: bool = False
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    tokenizer: str | None = None
    datagen: DatagenConfig = field(default_factory=DatagenConfig)


@dataclass
class TaskRunnerConfig:
    """Where a round's generate partitions run: a thread pool, or Ray (``dyngen[ray]``)."""

    kind: str = "threads"  # threads | ray
    # ray: an existing cluster ("auto", "ray://head:10001"); null starts a local Ray per round.
    address: str | None = None
    init_kwargs: dict[str, Any] = field(default_factory=dict)  # passed to ray.init
    # ray: what each partition reserves (num_gpus, num_cpus, resources, ...), as ray.remote.
    remote_options: dict[str, Any] = field(default_factory=dict)


@dataclass
class CompactionConfig:
    """After a round commits, compact the head's small shards (see dyngen.store.compaction).

    Runs after the round's commit and never fails a committed round.
    """

    enabled: bool = True
    max_small_shards: int = 50  # compact when the head has more shards below the target
    fan_in: int = 8  # adjacent shards of one size tier merged into one
    target_shard_mb: float = 128.0  # shards this large are never rewritten


@dataclass
class RoundConfig:
    """How a generation round runs: retries, timeout, dedup, user filters, partitions and
    compaction."""

    retries: int = 2
    retry_delay_seconds: float = 2.0
    timeout_seconds: float = 600.0
    dedup: bool = True
    # Each entry is {path, name, ...}: located like a generator, extra keys go to the filter.
    filters: list[dict[str, Any]] = field(default_factory=list)
    # Generation split into this many partitions, each a generate task on the task runner.
    partitions: int = 1
    task_runner: TaskRunnerConfig = field(default_factory=TaskRunnerConfig)
    # The only folders a trigger's rollouts file may be in (an event names the file; the
    # round reads it with the worker's rights), and the largest file it reads.
    # local_folder: the root itself, or for a URL root a local folder standing for it.
    rollouts_dirs: list[str] = field(
        default_factory=lambda: ["${local_folder:${store.root}}/rollouts"])
    max_rollouts_bytes: int = 64 * 1024 * 1024
    compaction: CompactionConfig = field(default_factory=CompactionConfig)


@dataclass
class DyngenConfig:
    """The whole configuration: ``store``, ``data`` and ``round`` sections."""

    store: StoreConfig = field(default_factory=StoreConfig)
    data: DataConfig = field(default_factory=DataConfig)
    round: RoundConfig = field(default_factory=RoundConfig)


# `${local_folder:${store.root}}`: rollouts files are local even when the store is not.
with warnings.catch_warnings():  # omegaconf 2.4 renamed it; 2.3's other name means another API
    warnings.simplefilter("ignore", UserWarning)
    OmegaConf.register_new_resolver("local_folder",
                                    lambda root: str(local_folder_for(str(root))), replace=True)

# Sections that accept keys the schema does not list (the generator's own settings).
_OPEN_SECTIONS = frozenset({"data.datagen"})

TASK_RUNNER_KINDS = ("threads", "ray")

_TYPE_WORDS: dict[Any, str] = {
    int: "an integer",
    float: "a number",
    bool: "a boolean (true or false)",
    str: "a string",
}


def default_config() -> DictConfig:
    """Return a fresh, typed config holding every default."""
    cfg = OmegaConf.structured(DyngenConfig)
    for dotted in _OPEN_SECTIONS:
        OmegaConf.set_struct(OmegaConf.select(cfg, dotted), False)
    return cfg


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
        cfg = _merge(cfg, base, "given config")
    if path is not None:
        source = f"config file {path}"
        cfg = _merge(cfg, _read_yaml(Path(path)), source)
    for text in overrides:
        key, value = _parse_override(text)
        source = f"override {text!r}"
        _check_shape(_nest(key, value), DyngenConfig, "", source)
        _apply_override(cfg, key, value, source)
    return validate(cfg)


def validate(cfg: DictConfig | Mapping[str, Any]) -> DictConfig:
    """Check keys, types and ranges; return a typed copy merged onto the defaults."""
    if not isinstance(cfg, (Mapping, DictConfig)):
        raise ConfigError(
            f"config: expected a mapping with sections store, data and round, "
            f"found {_describe(cfg)}. Pass a DictConfig or a dict."
        )
    merged = _merge(default_config(), cfg, "merged config")
    _check_resolvable(merged)
    _check_ranges(merged)
    return merged


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


# --- reading -----------------------------------------------------------------------------


def _read_yaml(path: Path) -> DictConfig:
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
        raise ConfigError(_yaml_error_message(where, text, exc)) from exc
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{where}: expected a valid config, found: {_first_line(exc)}.") from exc
    if not isinstance(loaded, DictConfig):
        raise ConfigError(
            f"{where}: expected a mapping with sections store, data and round at the top "
            f"level, found {_describe(OmegaConf.to_container(loaded))}. "
            "Write the file as `section:` blocks, e.g. `data:` then `  max_prompt_length: 512`."
        )
    return loaded


def _yaml_error_message(where: str, text: str, exc: yaml.YAMLError) -> str:
    """Describe a YAML syntax error with its line number and the line itself."""
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    detail = f"{problem} ({context})" if context else problem
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if mark is None:
        return f"{where}: expected valid YAML, found a syntax error: {detail}. Fix the YAML."
    lines = text.splitlines()
    line = min(mark.line, len(lines) - 1)
    # An unclosed bracket is reported at end of file; the last written line is the useful one.
    while line > 0 and not lines[line].strip():
        line -= 1
    shown = lines[line] if lines else ""
    return (
        f"{where}: expected valid YAML, found a syntax error at line {line + 1}: {detail}\n"
        f"    {line + 1} | {shown}\nFix the YAML at that line."
    )


def _parse_override(text: str) -> tuple[str, Any]:
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


def _nest(key: str, value: Any) -> dict[str, Any]:
    """Turn ``a.b.c`` and a value into ``{"a": {"b": {"c": value}}}``."""
    nested: Any = value
    for part in reversed(key.split(".")):
        nested = {part: nested}
    return nested


def _apply_override(cfg: DictConfig, key: str, value: Any, source: str) -> None:
    """Set one override on cfg, merging mappings into sections and replacing anything else."""
    merge = isinstance(value, Mapping) and dataclasses.is_dataclass(_schema_type(key))
    try:
        OmegaConf.update(cfg, key, value, merge=merge)
    except OmegaConfBaseException as exc:
        raise _wrap(exc, source) from exc


# --- checking ----------------------------------------------------------------------------


def _merge(base: DictConfig, other: DictConfig | Mapping[str, Any], source: str) -> DictConfig:
    """Merge other onto base after checking its keys and shapes; wrap OmegaConf errors."""
    try:
        plain = OmegaConf.to_container(other) if OmegaConf.is_config(other) else other
        _check_shape(plain, DyngenConfig, "", source)
        merged = OmegaConf.merge(base, other)
    except OmegaConfBaseException as exc:
        raise _wrap(exc, source) from exc
    return typing.cast(DictConfig, merged)


def _check_shape(value: Any, cls: type, prefix: str, source: str) -> None:
    """Reject unknown keys and sections/lists/values in the wrong place, with a suggestion."""
    if not isinstance(value, Mapping):
        raise _type_error(prefix.rstrip(".") or "config", _expected(cls), value, source)
    hints = typing.get_type_hints(cls)
    for key, item in value.items():
        full = f"{prefix}{key}"
        if key not in hints:
            if prefix.rstrip(".") in _OPEN_SECTIONS:
                continue
            raise _unknown_key(full, prefix, list(hints), source)
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            _check_shape(item, tp, f"{full}.", source)
        elif typing.get_origin(tp) is dict and not isinstance(item, (Mapping, str)):
            raise _type_error(full, _expected(tp), item, source)
        elif typing.get_origin(tp) is list:
            _check_list(full, tp, item, source)
        elif typing.get_origin(tp) not in (dict, list) and isinstance(item, (Mapping, list)):
            raise _type_error(full, _expected(tp), item, source)
        elif tp is bool and isinstance(item, (int, float)) and not isinstance(item, bool):
            # OmegaConf would read any number as a boolean; 5 is far more likely a mistake.
            raise _type_error(full, _expected(tp), item, source)


def _check_list(full: str, tp: Any, item: Any, source: str) -> None:
    """Check a list field holds mappings or strings, as declared (interpolations pass)."""
    if isinstance(item, str):
        return
    if not isinstance(item, list):
        raise _type_error(full, _expected(tp), item, source)
    of_text = typing.get_args(tp) == (str,)
    for index, entry in enumerate(item):
        if of_text and not isinstance(entry, str):
            raise _type_error(f"{full}[{index}]", "a string", entry, source)
        if not of_text and not isinstance(entry, Mapping):
            raise _type_error(f"{full}[{index}]", "a mapping with path and name", entry, source)


def _check_resolvable(cfg: DictConfig) -> None:
    """Resolve every interpolation once so a broken ``${...}`` fails here, not mid-round."""
    try:
        OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as exc:
        raise _wrap(exc, "merged config") from exc


def _non_empty(value: Any) -> bool:
    """Tell whether value is a string with something other than whitespace."""
    return isinstance(value, str) and bool(value.strip())


# key, check, what is expected, an example override that fixes it
_RANGE_CHECKS: tuple[tuple[str, Callable[[Any], bool], str, str], ...] = (
    ("store.root", _non_empty, "a non-empty directory path or URL", "store.root=dyngen_store"),
    (
        "store.cache_dir",
        lambda v: v is None or _non_empty(v),
        "null or a local folder for cached shards",
        "store.cache_dir=/tmp/dyngen-cache",
    ),
    ("data.prompt_key", _non_empty, "a non-empty column name", "data.prompt_key=prompt"),
    (
        "data.max_prompt_length",
        lambda v: v > 0,
        "a positive integer (tokens)",
        "data.max_prompt_length=512",
    ),
    (
        "data.tokenizer",
        lambda v: v is None or _non_empty(v),
        "null or a path to a local tokenizer folder",
        "data.tokenizer=/path/to/model",
    ),
    (
        "data.datagen.path",
        _non_empty,
        "a generator location (a file path, file://… or pkg://module)",
        "data.datagen.path=pkg://generators.base",
    ),
    (
        "data.datagen.name",
        _non_empty,
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
)


def _check_ranges(cfg: DictConfig) -> None:
    """Check values that have the right type but an impossible value."""
    for key, ok, expected, example in _RANGE_CHECKS:
        value = OmegaConf.select(cfg, key)
        if not ok(value):
            raise ConfigError(
                f"{key}: expected {expected}, found {_describe(value)}. Set it, e.g. {example}."
            )
    for index, folder in enumerate(cfg.round.rollouts_dirs):
        if not _non_empty(folder):
            raise ConfigError(
                f"round.rollouts_dirs[{index}]: expected a folder path, found "
                f"{_describe(folder)}. List the folders rollouts files may be read from, e.g. "
                "round.rollouts_dirs=[/data/rollouts]."
            )
    for index, entry in enumerate(cfg.round.filters):
        for part in ("path", "name"):
            value = entry.get(part)
            if not _non_empty(value):
                raise ConfigError(
                    f"round.filters[{index}].{part}: expected a non-empty string, found "
                    f"{_describe(value)}. Give each filter a path (file or pkg://module) "
                    "and a class name, e.g. {path: pkg://my_filters, name: MyFilter}."
                )
    runner = cfg.round.task_runner
    for key in ("address", "init_kwargs", "remote_options"):
        if runner.kind != "ray" and runner[key]:
            raise ConfigError(
                f"round.task_runner.{key}: applies only to round.task_runner.kind=ray, found "
                f"{_describe(runner[key])} with kind {runner.kind!r}. Set "
                f"round.task_runner.kind=ray, or remove round.task_runner.{key}."
            )


# --- messages ----------------------------------------------------------------------------


def _wrap(exc: OmegaConfBaseException, source: str) -> ConfigError:
    """Translate an OmegaConf exception into a ConfigError in dyngen's wording."""
    key = exc.full_key or ""
    if isinstance(exc, MissingMandatoryValue):
        return ConfigError(
            f"{key}: expected a value, found ??? (marked missing) ({source}). Set {key}."
        )
    if key and isinstance(exc, ValidationError):  # includes a resolved value of the wrong type
        return _type_error(key, _expected(_schema_type(key)), getattr(exc, "value", None), source)
    if isinstance(exc, InterpolationResolutionError):
        return ConfigError(
            f"{key}: expected an interpolation that resolves, found the error: "
            f"{_first_line(exc)} ({source}). Fix the ${{...}} reference or set a plain value."
        )
    if key and isinstance(exc, (ConfigKeyError, ConfigAttributeError)):
        prefix = key.rpartition(".")[0]
        parent = _schema_type(prefix) if prefix else DyngenConfig
        known = list(typing.get_type_hints(parent)) if dataclasses.is_dataclass(parent) else []
        return _unknown_key(key, f"{prefix}." if prefix else "", known, source)
    return ConfigError(
        f"{key or 'config'}: expected a valid value, found the error: {_first_line(exc)} "
        f"({source}). Fix that key."
    )


def _unknown_key(full: str, prefix: str, known: list[str], source: str) -> ConfigError:
    """Build the error for a key the schema does not have, suggesting the closest one."""
    name = full[len(prefix) :]
    section = prefix.rstrip(".") or "the top level"
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f"Did you mean {prefix}{close[0]}?" if close else "Remove it or fix its spelling."
    return ConfigError(
        f"unknown key {full}: expected one of {', '.join(known)} in {section}, "
        f"found {name!r} ({source}). {hint}"
    )


def _type_error(key: str, expected: str, found: Any, source: str) -> ConfigError:
    """Build the error for a value of the wrong type."""
    default = OmegaConf.select(default_config(), key, default=None)
    example = f" e.g. {key}={_yaml_scalar(default)}" if _is_scalar(default) else ""
    return ConfigError(
        f"{key}: expected {expected}, found {_describe(found)} ({source}). "
        f"Set {key} to {expected}{',' if example else ''}{example}."
    )


def _schema_type(key: str) -> Any:
    """Return the declared type at a dotted key, or Any where the schema is open."""
    tp: Any = DyngenConfig
    for part in key.split("."):
        if not dataclasses.is_dataclass(tp):
            return Any
        tp = typing.get_type_hints(tp).get(part.split("[")[0], Any)
    return tp


def _expected(tp: Any) -> str:
    """Describe a declared type in words."""
    if dataclasses.is_dataclass(tp):
        return f"a mapping with keys {', '.join(typing.get_type_hints(tp))}"
    origin = typing.get_origin(tp)
    if origin is dict:
        return "a mapping"
    if origin is list:
        return "a list"
    args = [arg for arg in typing.get_args(tp) if arg is not type(None)]
    if args and len(args) < len(typing.get_args(tp)):
        return f"{_expected(args[0])} or null"
    return _TYPE_WORDS.get(tp, "a value")


def _describe(value: Any) -> str:
    """Show a found value as the user would write it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return _yaml_scalar(value)
    if isinstance(value, (DictConfig, ListConfig)):
        value = OmegaConf.to_container(value)
    if isinstance(value, Mapping):
        return f"a mapping {dict(value)!r}"
    if isinstance(value, (list, tuple)):
        return f"a list {list(value)!r}"
    return repr(value)


def _is_scalar(value: Any) -> bool:
    """Tell whether value is a plain YAML scalar worth showing as an example."""
    return isinstance(value, (str, int, float, bool))


def _yaml_scalar(value: Any) -> str:
    """Format a scalar as it would be typed in an override."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _first_line(exc: BaseException) -> str:
    """Return the first line of an exception's message (OmegaConf appends key details)."""
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
