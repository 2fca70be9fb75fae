"""load_class with a base other than the generator's: messages follow the key, kind and base."""

from __future__ import annotations

import subprocess
import sys
from abc import ABC, abstractmethod
from pathlib import Path

import pytest

from dyngen.errors import (
    GeneratorClassNotFoundError,
    GeneratorError,
    GeneratorImportError,
    GeneratorNotFoundError,
    GeneratorTypeError,
)
from dyngen.plugins import MODULE_PREFIX, load_class
from tests.support import write

KEY = "round.filters[0]"


class KeepDropFilter(ABC):
    """Stands in for a filter base: one abstract method, like dyngen.filters.RowFilter."""

    @abstractmethod
    def check(self, rows: list[dict]) -> list[str | None]:
        """None keeps a row; a string drops it."""


BASE = f"{KeepDropFilter.__module__}.{KeepDropFilter.__qualname__}"

FILTER_SOURCE = f"""
from {KeepDropFilter.__module__} import KeepDropFilter

class ShortOnly(KeepDropFilter):
    def check(self, rows):
        return [None if len(r["text"]) < 5 else "too_long" for r in rows]

class StillAbstract(KeepDropFilter):
    pass

class NotAFilter:
    pass
"""


def load(path: str | Path, name: str) -> type[KeepDropFilter]:
    """load_class as a filter entry would call it."""
    return load_class(str(path), name, KeepDropFilter, key=KEY, kind="filter")


@pytest.fixture
def filter_file(tmp_path: Path) -> Path:
    """A user filter file with one concrete filter, one abstract one and a non-filter."""
    return write(tmp_path / "my_filter.py", FILTER_SOURCE)


def test_loads_filter_from_file_and_file_url(filter_file: Path) -> None:
    cls = load(filter_file, "ShortOnly")
    assert issubclass(cls, KeepDropFilter)
    assert cls().check([{"text": "ok"}, {"text": "far too long"}]) == [None, "too_long"]
    assert cls.__module__.startswith(f"{MODULE_PREFIX}my_filter_")
    assert load(f"file://{filter_file}", "ShortOnly").__name__ == "ShortOnly"


def test_missing_file_names_the_filter_key(tmp_path: Path) -> None:
    with pytest.raises(GeneratorNotFoundError) as info:
        load(tmp_path / "nope.py", "ShortOnly")
    message = str(info.value)
    assert f"{KEY}.path" in message and "filter file" in message
    assert "data.datagen" not in message and "generator" not in message


def test_missing_class_lists_concrete_filters_only(filter_file: Path) -> None:
    with pytest.raises(GeneratorClassNotFoundError) as info:
        load(filter_file, "Short")
    message = str(info.value)
    assert "Its filter classes are: 'ShortOnly'." in message and f"{KEY}.name" in message
    # Neither the imported base, the abstract subclass nor the unrelated class is offered.
    assert "'KeepDropFilter'" not in message and "StillAbstract" not in message
    assert "NotAFilter" not in message


def test_missing_class_in_file_without_filters(tmp_path: Path) -> None:
    with pytest.raises(GeneratorClassNotFoundError, match=f"defines no subclass of {BASE}"):
        load(write(tmp_path / "plain.py", "X = 1\n"), "ShortOnly")


def test_not_a_subclass_names_the_custom_base(filter_file: Path) -> None:
    with pytest.raises(GeneratorTypeError) as info:
        load(filter_file, "NotAFilter")
    message = str(info.value)
    assert message.startswith("filter class 'NotAFilter'") and str(filter_file) in message
    assert f"must inherit from {BASE}" in message and "AbstractDataGenerator" not in message


def test_abstract_filter_is_rejected(filter_file: Path) -> None:
    with pytest.raises(GeneratorTypeError, match="filter class 'StillAbstract'.*implement check"):
        load(filter_file, "StillAbstract")


def test_same_named_foreign_base_gets_a_hint(tmp_path: Path) -> None:
    foreign = write(
        tmp_path / "foreign.py",
        """
        class KeepDropFilter:  # a look-alike, not the configured base
            pass

        class Gen(KeepDropFilter):
            pass
        """,
    )
    with pytest.raises(GeneratorTypeError) as info:
        load(foreign, "Gen")
    assert (
        f"different class; import KeepDropFilter from {KeepDropFilter.__module__} instead"
        in str(info.value)
    )


@pytest.mark.parametrize(
    ("path", "name", "key"), [("", "ShortOnly", f"{KEY}.path"), ("f.py", None, f"{KEY}.name")]
)
def test_unset_path_or_name_names_the_filter_key(path: str, name: str | None, key: str) -> None:
    with pytest.raises(GeneratorError) as info:
        load(path, name)  # type: ignore[arg-type]
    assert str(info.value).startswith(f"{key} must be set")


def test_failed_import_leaves_no_module_behind(tmp_path: Path) -> None:
    bad = write(tmp_path / "bad_filter.py", "raise RuntimeError('boom at import')\n")
    with pytest.raises(GeneratorImportError, match="filter module .*RuntimeError: boom"):
        load(bad, "ShortOnly")
    assert not [m for m in sys.modules if m.startswith(f"{MODULE_PREFIX}bad_filter_")]


def test_plugins_does_not_import_generators() -> None:
    # The core must load without the generators package: imports go generators -> dyngen.
    code = "import sys, dyngen.plugins; sys.exit('generators' in sys.modules)"
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run([sys.executable, "-c", code], cwd=root, check=False)
    assert result.returncode == 0
