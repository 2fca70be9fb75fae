"""The config's error messages, in dyngen's wording: key, expected, found, what to do."""

from __future__ import annotations

import dataclasses
import difflib
import typing
from collections.abc import Mapping
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

from dyngen.config.schema import DyngenConfig, default_config
from dyngen.errors import ConfigError

_TYPE_WORDS: dict[Any, str] = {
    int: "an integer",
    float: "a number",
    bool: "a boolean (true or false)",
    str: "a string",
}



# --- messages ----------------------------------------------------------------------------


def wrap(exc: OmegaConfBaseException, source: str) -> ConfigError:
    """Translate an OmegaConf exception into a ConfigError in dyngen's wording."""
    key = exc.full_key or ""
    if isinstance(exc, MissingMandatoryValue):
        return ConfigError(
            f"{key}: expected a value, found ??? (marked missing) ({source}). Set {key}."
        )
    if key and isinstance(exc, ValidationError):  # includes a resolved value of the wrong type
        return type_error(key, type_words(schema_type(key)), getattr(exc, "value", None), source)
    if isinstance(exc, InterpolationResolutionError):
        return ConfigError(
            f"{key}: expected an interpolation that resolves, found the error: "
            f"{first_line(exc)} ({source}). Fix the ${{...}} reference or set a plain value."
        )
    if key and isinstance(exc, (ConfigKeyError, ConfigAttributeError)):
        prefix = key.rpartition(".")[0]
        parent = schema_type(prefix) if prefix else DyngenConfig
        known = list(typing.get_type_hints(parent)) if dataclasses.is_dataclass(parent) else []
        return unknown_key(key, f"{prefix}." if prefix else "", known, source)
    return ConfigError(
        f"{key or 'config'}: expected a valid value, found the error: {first_line(exc)} "
        f"({source}). Fix that key."
    )


# Keys a release removed, and why: a config that still sets one is told so, not guessed at.
REMOVED_KEYS = {
    "round.order_wait_seconds": "rounds no longer wait for earlier steps: each round covers "
                                "every batch end pending in the store, which keeps each "
                                "training run's steps in order",
}


def unknown_key(full: str, prefix: str, known: list[str], source: str) -> ConfigError:
    """Build the error for a key the schema does not have, suggesting the closest one."""
    if full in REMOVED_KEYS:
        return ConfigError(f"{full} was removed: {REMOVED_KEYS[full]}; expected no {full}, "
                           f"found it ({source}). Delete it.")
    name = full[len(prefix) :]
    section = prefix.rstrip(".") or "the top level"
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f"Did you mean {prefix}{close[0]}?" if close else "Remove it or fix its spelling."
    return ConfigError(
        f"unknown key {full}: expected one of {', '.join(known)} in {section}, "
        f"found {name!r} ({source}). {hint}"
    )


def type_error(key: str, expected: str, found: Any, source: str) -> ConfigError:
    """Build the error for a value of the wrong type."""
    default = OmegaConf.select(default_config(), key, default=None)
    example = f" e.g. {key}={yaml_scalar(default)}" if is_scalar(default) else ""
    return ConfigError(
        f"{key}: expected {expected}, found {describe(found)} ({source}). "
        f"Set {key} to {expected}{',' if example else ''}{example}."
    )


def schema_type(key: str) -> Any:
    """Return the declared type at a dotted key, or Any where the schema is open."""
    tp: Any = DyngenConfig
    for part in key.split("."):
        if not dataclasses.is_dataclass(tp):
            return Any
        tp = typing.get_type_hints(tp).get(part.split("[")[0], Any)
    return tp


def type_words(tp: Any) -> str:
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
        return f"{type_words(args[0])} or null"
    return _TYPE_WORDS.get(tp, "a value")


def describe(value: Any) -> str:
    """Show a found value as the user would write it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return yaml_scalar(value)
    if isinstance(value, (DictConfig, ListConfig)):
        value = OmegaConf.to_container(value)
    if isinstance(value, Mapping):
        return f"a mapping {dict(value)!r}"
    if isinstance(value, (list, tuple)):
        return f"a list {list(value)!r}"
    return repr(value)


def is_scalar(value: Any) -> bool:
    """Tell whether value is a plain YAML scalar worth showing as an example."""
    return isinstance(value, (str, int, float, bool))


def yaml_scalar(value: Any) -> str:
    """Format a scalar as it would be typed in an override."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def first_line(exc: BaseException) -> str:
    """Return the first line of an exception's message (OmegaConf appends key details)."""
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def yaml_error_message(where: str, text: str, exc: yaml.YAMLError) -> str:
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
