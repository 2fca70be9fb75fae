"""Find the generator class named by ``data.datagen.path`` and ``data.datagen.name``."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from omegaconf import DictConfig, OmegaConf

from dyngen.errors import (
    GeneratorClassNotFoundError,
    GeneratorError,
    GeneratorImportError,
    GeneratorNotFoundError,
    GeneratorTypeError,
)
from generators.base import AbstractDataGenerator

PKG_PREFIX = "pkg://"
FILE_PREFIX = "file://"
BASE_CLASS = f"{AbstractDataGenerator.__module__}.{AbstractDataGenerator.__qualname__}"
_PATH_FORMS = "a .py file path, 'file://<path>' or 'pkg://<dotted.module>'"


def load_generator_class(path: str, name: str) -> type[AbstractDataGenerator]:
    """Import ``path`` and return its ``AbstractDataGenerator`` subclass called ``name``."""
    if not isinstance(path, str) or not path.strip():
        raise GeneratorError(f"data.datagen.path must be set to {_PATH_FORMS}; got {path!r}.")
    if not isinstance(name, str) or not name.strip():
        raise GeneratorError(
            f"data.datagen.name must be set to the generator class in {path!r}; got {name!r}."
        )
    if path.startswith(PKG_PREFIX):
        module = _import_package_module(path, name)
    else:
        module = _import_file_module(path, name)
    if not hasattr(module, name):
        raise GeneratorClassNotFoundError(
            f"generator module {path!r} has no attribute {name!r}. {_candidates_hint(module)} "
            "Set data.datagen.name to one of its generator classes."
        )
    return _check_generator_class(getattr(module, name), path, name)


def build_generator(
    datagen_config: DictConfig | Mapping[str, Any] | None,
) -> AbstractDataGenerator:
    """Load the class named by the ``datagen`` subtree and build it with that subtree."""
    if datagen_config is None:
        raise GeneratorError("data.datagen must be set, with keys 'path' and 'name'.")
    config = (
        datagen_config
        if isinstance(datagen_config, DictConfig)
        else OmegaConf.create(dict(datagen_config))
    )
    # select() yields None for absent keys and '???' alike, so both hit the "must be set" error.
    path = OmegaConf.select(config, "path", default=None)
    name = OmegaConf.select(config, "name", default=None)
    cls = load_generator_class(path, name)
    # Same call verl makes (cls(config.datagen)), so verl generators build unchanged.
    return cls(config)


def _import_package_module(path: str, name: str) -> ModuleType:
    """Import the module of a ``pkg://a.b.c`` or ``pkg://a/b/c`` path."""
    dotted = path[len(PKG_PREFIX) :].strip("/").replace("/", ".")
    if not dotted:
        raise GeneratorError(f"data.datagen.path {path!r} names no module; expected {_PATH_FORMS}.")
    try:
        return importlib.import_module(dotted)
    except ModuleNotFoundError as exc:
        # A missing dependency inside an existing module also raises ModuleNotFoundError;
        # only a miss on the module itself or one of its parents means "not found".
        if exc.name and (dotted == exc.name or dotted.startswith(exc.name + ".")):
            raise GeneratorNotFoundError(
                f"generator module {dotted!r} not found (data.datagen.path={path!r}, "
                f"class {name!r}): no module named {exc.name!r}. Check the dotted name, and "
                "that its package is installed or on PYTHONPATH."
            ) from exc
        raise _import_failed(path, name, exc) from exc
    except Exception as exc:
        raise _import_failed(path, name, exc) from exc


def _import_file_module(path: str, name: str) -> ModuleType:
    """Execute a generator file as a fresh module with a name unique to its absolute path."""
    raw = path[len(FILE_PREFIX) :] if path.startswith(FILE_PREFIX) else path
    file = Path(raw).expanduser().resolve()
    if not file.is_file():
        found = "is a directory" if file.is_dir() else "does not exist"
        raise GeneratorNotFoundError(
            f"generator file for class {name!r} not found: data.datagen.path={path!r} "
            f"resolves to {str(file)!r}, which {found}. Set data.datagen.path to {_PATH_FORMS}."
        )
    module_name = _module_name_for(file)
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise GeneratorImportError(
            f"cannot import {str(file)!r} (data.datagen.path={path!r}, class {name!r}) as a "
            "Python module. Point data.datagen.path at a .py file."
        )
    module = importlib.util.module_from_spec(spec)
    # Registered before running so dataclasses, pickling and typing can find the module;
    # re-running on every load replaces the entry, so a second load sees the current file.
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise _import_failed(path, name, exc) from exc
    return module


def _module_name_for(file: Path) -> str:
    """Return a module name that is stable per absolute path and readable in tracebacks."""
    digest = hashlib.sha256(str(file).encode()).hexdigest()[:12]
    stem = re.sub(r"\W", "_", file.stem)
    return f"_dyngen_generator_{stem}_{digest}"


def _import_failed(path: str, name: str, exc: Exception) -> GeneratorImportError:
    """Describe an exception raised by the user's module while it was being imported."""
    return GeneratorImportError(
        f"generator module {path!r} (class {name!r}) failed to import: "
        f"{type(exc).__name__}: {exc}. Fix the module, or install the dependency it is missing."
    )


def _candidates_hint(module: ModuleType) -> str:
    """Name the concrete generator classes a module does define, to suggest a fix."""
    found = sorted(
        attr
        for attr, value in vars(module).items()
        if inspect.isclass(value)
        and issubclass(value, AbstractDataGenerator)
        and not inspect.isabstract(value)
    )
    if not found:
        return f"It defines no subclass of {BASE_CLASS}."
    return "Its generator classes are: " + ", ".join(repr(attr) for attr in found) + "."


def _check_generator_class(obj: object, path: str, name: str) -> type[AbstractDataGenerator]:
    """Return ``obj`` if it is a concrete AbstractDataGenerator subclass, else explain why not."""
    if not inspect.isclass(obj):
        raise GeneratorTypeError(
            f"generator {name!r} from {path!r} must be a class that inherits from {BASE_CLASS}; "
            f"found a {type(obj).__name__} instance."
        )
    if not issubclass(obj, AbstractDataGenerator):
        raise GeneratorTypeError(
            f"generator class {name!r} from {path!r} must inherit from {BASE_CLASS}; its bases "
            f"are {_qualified_bases(obj)}.{_foreign_base_hint(obj)}"
        )
    if inspect.isabstract(obj):
        missing = ", ".join(sorted(obj.__abstractmethods__))
        raise GeneratorTypeError(
            f"generator class {name!r} from {path!r} is abstract: implement {missing}."
        )
    return obj


def _qualified_bases(cls: type) -> str:
    """List a class's direct bases by qualified name."""
    return ", ".join(f"{base.__module__}.{base.__qualname__}" for base in cls.__bases__)


def _foreign_base_hint(cls: type) -> str:
    """Spot a same-named base from elsewhere (e.g. verl's), the likeliest cause of the error."""
    for base in cls.__mro__[1:]:
        if base.__name__ == AbstractDataGenerator.__name__:
            return (
                f" It derives from {base.__module__}.{base.__qualname__}, a different class; "
                f"import AbstractDataGenerator from {AbstractDataGenerator.__module__} instead."
            )
    return ""
