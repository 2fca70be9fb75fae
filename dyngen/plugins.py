"""Load a user class (a generator, a filter, ...) named by a config's ``path`` and ``name``.

``path`` is a ``.py`` file, ``file://<path>`` or ``pkg://<dotted.module>``; ``name`` is the
class in it, which must be a concrete subclass of a given base. Every message names the
config key (``data.datagen``, ``round.filters[0]``) and the kind of plugin, so the user knows
which entry to fix. The error classes are called ``Generator*`` for history; they cover any
plugin.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from dyngen.errors import (
    GeneratorClassNotFoundError,
    GeneratorError,
    GeneratorImportError,
    GeneratorNotFoundError,
    GeneratorTypeError,
)
from dyngen.text import closest, did_you_mean

PKG_PREFIX = "pkg://"
FILE_PREFIX = "file://"
MODULE_PREFIX = "_dyngen_plugin_"
PATH_FORMS = "a .py file path, 'file://<path>' or 'pkg://<dotted.module>'"

T = TypeVar("T")


def qualified_name(cls: type) -> str:
    """Return ``module.QualName`` of a class, as shown in error messages."""
    return f"{cls.__module__}.{cls.__qualname__}"


@dataclass(frozen=True)
class _Where:
    """What is being loaded and from which config entry, for error messages."""

    path: str
    name: str
    key: str
    kind: str


def load_class(
    path: str,
    name: str,
    base: type[T],
    *,
    key: str = "data.datagen",
    kind: str = "generator",
) -> type[T]:
    """Import ``path`` and return its concrete ``base`` subclass called ``name``.

    ``key`` is the config entry holding ``path`` and ``name`` and ``kind`` what the class
    is; both only shape error messages.
    """
    if not isinstance(path, str) or not path.strip():
        raise GeneratorError(f"{key}.path must be set to {PATH_FORMS}; got {path!r}.")
    if not isinstance(name, str) or not name.strip():
        raise GeneratorError(
            f"{key}.name must be set to the {kind} class in {path!r}; got {name!r}."
        )
    where = _Where(path, name, key, kind)
    if path.startswith(PKG_PREFIX):
        module = _import_package_module(where)
    else:
        module = _import_file_module(where)
    if not hasattr(module, name):
        classes = _candidates(module, base)
        found = f"Its {kind} classes are: {', '.join(map(repr, classes))}." if classes \
            else f"It defines no subclass of {qualified_name(base)}."
        raise GeneratorClassNotFoundError(
            f"{kind} module {path!r} has no attribute {name!r}. {found} "
            f"Set {key}.name to one of its {kind} classes.{did_you_mean(name, classes)}"
        )
    return _check_class(getattr(module, name), base, where)


def load_function(path: str, name: str, *, key: str, kind: str = "function") -> Callable[..., Any]:
    """Import ``path`` (as `load_class` does) and return its callable ``name``.

    verl names a reward function this way (``custom_reward_function.path`` and ``.name``).
    """
    if not isinstance(path, str) or not path.strip():
        raise GeneratorError(f"{key}.path must be set to {PATH_FORMS}; got {path!r}.")
    if not isinstance(name, str) or not name.strip():
        raise GeneratorError(f"{key}.name must be set to the {kind} in {path!r}; got {name!r}.")
    where = _Where(path, name, key, kind)
    module = (_import_package_module(where) if path.startswith(PKG_PREFIX)
              else _import_file_module(where))
    found = getattr(module, name, None)
    if not callable(found) or inspect.isclass(found):
        functions = sorted(a for a, v in vars(module).items()
                           if inspect.isfunction(v) and not a.startswith("_"))
        what = "has no attribute" if found is None else "has a non-function attribute"
        raise GeneratorClassNotFoundError(
            f"{kind} module {path!r} {what} {name!r}; its functions are "
            f"{', '.join(functions) or 'none'}. Set {key}.name to the {kind}.")
    return found


def _import_package_module(where: _Where) -> ModuleType:
    """Import the module of a ``pkg://a.b.c`` or ``pkg://a/b/c`` path."""
    path, key = where.path, where.key
    dotted = path[len(PKG_PREFIX) :].strip("/").replace("/", ".")
    if not dotted:
        raise GeneratorError(f"{key}.path {path!r} names no module; expected {PATH_FORMS}.")
    _refuse_moved_path(dotted, where)
    try:
        return importlib.import_module(dotted)
    except ModuleNotFoundError as exc:
        # A missing dependency inside an existing module also raises ModuleNotFoundError;
        # only a miss on the module itself or one of its parents means "not found".
        if exc.name and (dotted == exc.name or dotted.startswith(exc.name + ".")):
            raise GeneratorNotFoundError(
                f"{where.kind} module {dotted!r} not found ({key}.path={path!r}, "
                f"class {where.name!r}): no module named {exc.name!r}. Check the dotted name, "
                "and that its package is installed or on PYTHONPATH."
            ) from exc
        raise _import_failed(where, exc) from exc
    except Exception as exc:
        raise _import_failed(where, exc) from exc


# Top-level packages dyngen once installed beside itself, now inside it.
MOVED_PACKAGES = ("generators", "tasks", "flows")


def _refuse_moved_path(dotted: str, where: _Where) -> None:
    """A path from before dyngen's packages moved inside it (``pkg://generators.proposer``)
    fails at once, naming the new one, unless a module of that name is the user's own."""
    if dotted.split(".")[0] not in MOVED_PACKAGES or _module_exists(dotted):
        return
    if not _module_exists(f"dyngen.{dotted}"):
        return
    raise GeneratorNotFoundError(
        f"{where.key}.path={where.path!r} is the path dyngen's built-in {where.kind}s had "
        f"before they moved into the dyngen package; expected "
        f"'{PKG_PREFIX}dyngen.{dotted}'. Set {where.key}.path={PKG_PREFIX}dyngen.{dotted}."
    )


def _module_exists(dotted: str) -> bool:
    try:
        return importlib.util.find_spec(dotted) is not None
    except (ImportError, ValueError):
        return False


def _import_file_module(where: _Where) -> ModuleType:
    """Execute a plugin file as a fresh module with a name unique to its absolute path."""
    path, key = where.path, where.key
    raw = path[len(FILE_PREFIX) :] if path.startswith(FILE_PREFIX) else path
    file = Path(raw).expanduser().resolve()
    if not file.is_file():
        found = "is a directory" if file.is_dir() else "does not exist"
        raise GeneratorNotFoundError(
            f"{where.kind} file for class {where.name!r} not found: {key}.path={path!r} "
            f"resolves to {str(file)!r}, which {found}. Set {key}.path to {PATH_FORMS}."
            f"{_near_file(file, raw)}"
        )
    module_name = module_name_for(file)
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise GeneratorImportError(
            f"cannot import {str(file)!r} ({key}.path={path!r}, class {where.name!r}) as a "
            f"Python module. Point {key}.path at a .py file."
        )
    module = importlib.util.module_from_spec(spec)
    # Registered before running so dataclasses, pickling and typing can find the module;
    # re-running on every load replaces the entry, so a second load sees the current file.
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise _import_failed(where, exc) from exc
    return module


def _near_file(file: Path, raw: str) -> str:
    """" Did you mean x.py?" for a .py file beside the missing one with a name like it."""
    try:
        names = sorted(p.name for p in file.parent.glob("*.py"))
    except OSError:
        return ""
    near = closest(file.name, names)
    # Written as the user wrote the path: their folder part, the close file name.
    return f" Did you mean {raw[: len(raw) - len(Path(raw).name)]}{near}?" if near else ""


def module_name_for(file: Path) -> str:
    """Return a module name that is stable per absolute path and readable in tracebacks."""
    digest = hashlib.sha256(str(file).encode()).hexdigest()[:12]
    stem = re.sub(r"\W", "_", file.stem)
    return f"{MODULE_PREFIX}{stem}_{digest}"


def _import_failed(where: _Where, exc: Exception) -> GeneratorImportError:
    """Describe an exception raised by the user's module while it was being imported."""
    return GeneratorImportError(
        f"{where.kind} module {where.path!r} (class {where.name!r}) failed to import: "
        f"{type(exc).__name__}: {exc}. Fix the module, or install the dependency it is missing."
    )


def _candidates(module: ModuleType, base: type) -> list[str]:
    """The concrete ``base`` subclasses a module defines, to suggest a fix."""
    return sorted(
        attr
        for attr, value in vars(module).items()
        if inspect.isclass(value)
        and issubclass(value, base)
        and value is not base
        and not inspect.isabstract(value)
    )


def _check_class(obj: object, base: type[T], where: _Where) -> type[T]:
    """Return ``obj`` if it is a concrete ``base`` subclass, else explain why not."""
    kind, name, path, base_name = where.kind, where.name, where.path, qualified_name(base)
    if not inspect.isclass(obj):
        raise GeneratorTypeError(
            f"{kind} {name!r} from {path!r} must be a class that inherits from {base_name}; "
            f"found a {type(obj).__name__} instance."
        )
    if not issubclass(obj, base):
        raise GeneratorTypeError(
            f"{kind} class {name!r} from {path!r} must inherit from {base_name}; its bases "
            f"are {_qualified_bases(obj)}.{_foreign_base_hint(obj, base)}"
        )
    if inspect.isabstract(obj):
        missing = ", ".join(sorted(obj.__abstractmethods__))
        raise GeneratorTypeError(
            f"{kind} class {name!r} from {path!r} is abstract: implement {missing}."
        )
    return obj


def _qualified_bases(cls: type) -> str:
    """List a class's direct bases by qualified name."""
    return ", ".join(qualified_name(parent) for parent in cls.__bases__)


def _foreign_base_hint(cls: type, base: type) -> str:
    """Spot a same-named base from elsewhere (e.g. verl's), the likeliest cause of the error."""
    for parent in cls.__mro__[1:]:
        if parent.__name__ == base.__name__:
            return (
                f" It derives from {qualified_name(parent)}, a different class; "
                f"import {base.__name__} from {base.__module__} instead."
            )
    return ""
