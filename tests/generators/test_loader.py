"""Loading generator classes from files and packages, and every way it can fail."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf

from dyngen.errors import (
    GeneratorClassNotFoundError,
    GeneratorError,
    GeneratorImportError,
    GeneratorNotFoundError,
    GeneratorTypeError,
)
from dyngen.generators import AbstractDataGenerator, MockDataGenerator, build_generator
from dyngen.generators import load_generator_class as load
from tests.generators.contract import make_seed_dataset
from tests.support import write

BASE = "dyngen.generators.base.AbstractDataGenerator"

GOOD_SOURCE = """
from dyngen.generators.base import AbstractDataGenerator

VALUE = "{value}"

class EchoGenerator(AbstractDataGenerator):
    def generate(self, dataset):
        return getattr(dataset, "dataframe", dataset).select([0])

class HelperNotAGenerator:
    pass

NOT_A_CLASS = 42
"""


@pytest.fixture
def gen_file(tmp_path: Path) -> Path:
    """A user generator file defining EchoGenerator and two non-generators."""
    return write(tmp_path / "my_gen.py", GOOD_SOURCE.format(value="first"))


# --- success ---------------------------------------------------------------------------


def test_loads_from_absolute_file_path(gen_file: Path) -> None:
    cls = load(str(gen_file), "EchoGenerator")
    assert cls.__name__ == "EchoGenerator" and issubclass(cls, AbstractDataGenerator)


def test_loads_from_relative_file_path(gen_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(gen_file.parent)
    assert load("my_gen.py", "EchoGenerator").__name__ == "EchoGenerator"
    assert load("file://my_gen.py", "EchoGenerator").__name__ == "EchoGenerator"


def test_loads_from_file_url(gen_file: Path) -> None:
    assert load(f"file://{gen_file}", "EchoGenerator").__name__ == "EchoGenerator"


@pytest.mark.parametrize("path", ["pkg://dyngen.generators.base", "pkg://dyngen.generators/base"])
def test_loads_from_package(path: str) -> None:
    assert load(path, "MockDataGenerator") is MockDataGenerator


def test_same_file_loads_twice_and_sees_edits(gen_file: Path) -> None:
    first = load(str(gen_file), "EchoGenerator")
    write(gen_file, GOOD_SOURCE.format(value="second"))
    second = load(str(gen_file), "EchoGenerator")
    assert sys.modules[first.__module__].VALUE == "second"
    assert second is not first and first.__module__ == second.__module__


def test_same_basename_in_two_dirs_does_not_collide(tmp_path: Path) -> None:
    file_a = write(tmp_path / "a" / "gen.py", GOOD_SOURCE.format(value="a"))
    file_b = write(tmp_path / "b" / "gen.py", GOOD_SOURCE.format(value="b"))
    cls_a = load(str(file_a), "EchoGenerator")
    cls_b = load(str(file_b), "EchoGenerator")
    assert cls_a.__module__ != cls_b.__module__
    assert sys.modules[cls_a.__module__].VALUE == "a"
    assert sys.modules[cls_b.__module__].VALUE == "b"


def test_build_generator_passes_datagen_subtree(gen_file: Path) -> None:
    data = OmegaConf.create(
        {
            "max_prompt_length": 512,
            "datagen": {"path": str(gen_file), "name": "EchoGenerator", "temperature": 0.7},
        }
    )
    generator = build_generator(data.datagen)
    assert type(generator).__name__ == "EchoGenerator"
    assert generator.config is data.datagen
    assert generator.config.temperature == 0.7


def test_build_generator_converts_dict_to_dictconfig() -> None:
    generator = build_generator(
        {"path": "pkg://dyngen.generators.base", "name": "MockDataGenerator", "seed": 3}
    )
    assert isinstance(generator, MockDataGenerator)
    assert isinstance(generator.config, DictConfig) and generator.config.seed == 3
    assert len(generator.generate(make_seed_dataset())) == 1


# --- not found -------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.py"
    with pytest.raises(GeneratorNotFoundError) as info:
        load(str(missing), "EchoGenerator")
    message = str(info.value)
    assert str(missing) in message and "'EchoGenerator'" in message
    assert "does not exist" in message and "data.datagen.path" in message


def test_missing_file_url(tmp_path: Path) -> None:
    with pytest.raises(GeneratorNotFoundError, match="nope.py"):
        load(f"file://{tmp_path / 'nope.py'}", "EchoGenerator")


def test_directory_is_not_a_generator_file(tmp_path: Path) -> None:
    with pytest.raises(GeneratorNotFoundError, match="is a directory"):
        load(str(tmp_path), "EchoGenerator")


@pytest.mark.parametrize(
    "path", ["pkg://dyngen.generators.no_such_module", "pkg://no_such_dyngen_pkg/sub/mod"]
)
def test_missing_package_module(path: str) -> None:
    with pytest.raises(GeneratorNotFoundError) as info:
        load(path, "Gen")
    assert path in str(info.value) and "'Gen'" in str(info.value)
    assert isinstance(info.value.__cause__, ModuleNotFoundError)


# --- import errors inside the user's module --------------------------------------------


@pytest.mark.parametrize(
    ("source", "cause", "shown"),
    [
        ("import dyngen_missing_dependency_xyz\n", ModuleNotFoundError, "dyngen_missing_dep"),
        ("def broken(:\n    pass\n", SyntaxError, "SyntaxError"),
        ("raise RuntimeError('boom at import')\n", RuntimeError, "RuntimeError: boom at import"),
    ],
)
def test_error_inside_user_file_is_chained(
    tmp_path: Path, source: str, cause: type[Exception], shown: str
) -> None:
    bad = write(tmp_path / "bad_gen.py", source)
    with pytest.raises(GeneratorImportError) as info:
        load(str(bad), "Gen")
    message = str(info.value)
    assert type(info.value.__cause__) is cause
    assert shown in message and cause.__name__ in message
    assert str(bad) in message and "'Gen'" in message
    assert not [name for name in sys.modules if name.startswith("_dyngen_plugin_bad_gen_")]


def test_missing_dependency_of_package_module_is_import_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The module exists, so this must not be reported as "module not found".
    write(tmp_path / "dyngen_test_userpkg" / "__init__.py", "")
    write(tmp_path / "dyngen_test_userpkg" / "broken.py", "import dyngen_missing_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(GeneratorImportError) as info:
        load("pkg://dyngen_test_userpkg.broken", "Gen")
    assert "dyngen_missing_dependency_xyz" in str(info.value)
    assert isinstance(info.value.__cause__, ModuleNotFoundError)


# --- wrong class -----------------------------------------------------------------------


def test_missing_class_lists_generators_defined(gen_file: Path) -> None:
    with pytest.raises(GeneratorClassNotFoundError) as info:
        load(str(gen_file), "EchoGen")
    message = str(info.value)
    assert "'EchoGen'" in message and str(gen_file) in message
    assert "'EchoGenerator'" in message
    assert "HelperNotAGenerator" not in message and "'AbstractDataGenerator'" not in message


def test_missing_class_in_file_without_generators(tmp_path: Path) -> None:
    plain = write(tmp_path / "plain.py", "X = 1\n")
    with pytest.raises(GeneratorClassNotFoundError, match=f"defines no subclass of {BASE}"):
        load(str(plain), "Gen")


def test_not_a_subclass_names_class_path_and_base(gen_file: Path) -> None:
    with pytest.raises(GeneratorTypeError) as info:
        load(str(gen_file), "HelperNotAGenerator")
    message = str(info.value)
    assert "'HelperNotAGenerator'" in message and str(gen_file) in message
    assert BASE in message and "{abs_cls}" not in message


def test_not_a_class(gen_file: Path) -> None:
    with pytest.raises(GeneratorTypeError, match=f"'NOT_A_CLASS'.*{BASE}.*int instance"):
        load(str(gen_file), "NOT_A_CLASS")


def test_same_named_foreign_base_gets_a_hint(tmp_path: Path) -> None:
    foreign = write(
        tmp_path / "foreign.py",
        """
        class AbstractDataGenerator:  # e.g. verl's own base class
            pass

        class Gen(AbstractDataGenerator):
            pass
        """,
    )
    with pytest.raises(GeneratorTypeError, match="different class; import AbstractDataGenerator"):
        load(str(foreign), "Gen")


def test_abstract_class_is_rejected() -> None:
    with pytest.raises(GeneratorTypeError, match="is abstract: implement generate"):
        load("pkg://dyngen.generators.base", "AbstractDataGenerator")


# --- unset config ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "name", "key"),
    [
        ("", "Gen", "data.datagen.path"),
        (None, "Gen", "data.datagen.path"),
        ("gen.py", "", "data.datagen.name"),
        ("gen.py", None, "data.datagen.name"),
    ],
)
def test_unset_path_or_name(path: str | None, name: str | None, key: str) -> None:
    with pytest.raises(GeneratorError, match=f"{key} must be set"):
        load(path, name)  # type: ignore[arg-type]


def test_build_generator_with_unset_keys() -> None:
    with pytest.raises(GeneratorError, match="data.datagen.name must be set"):
        build_generator({"path": "pkg://dyngen.generators.base", "name": "???"})
    with pytest.raises(GeneratorError, match="data.datagen must be set"):
        build_generator(None)


# --- verl compatibility ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "name", "builtin"),
    [
        ("{dir}/nope.py", "Gen", FileNotFoundError),
        ("pkg://dyngen.generators.no_such_module", "Gen", FileNotFoundError),
        ("{dir}/my_gen.py", "Missing", AttributeError),
        ("{dir}/my_gen.py", "HelperNotAGenerator", TypeError),
        ("{dir}/bad.py", "Gen", ImportError),
    ],
)
def test_errors_are_caught_as_builtins_like_verl(
    gen_file: Path, path: str, name: str, builtin: type[Exception]
) -> None:
    write(gen_file.parent / "bad.py", "import dyngen_missing_dependency_xyz\n")
    with pytest.raises(builtin):
        load(path.format(dir=gen_file.parent), name)


@pytest.mark.parametrize("old", ["pkg://generators.proposer", "pkg://generators.code_tasks",
                                 "pkg://generators/arithmetic"])
def test_a_path_from_before_the_move_names_the_new_one(old: str) -> None:
    """Built-in generators moved into the dyngen package: a config written before fails at
    once with the path to write instead, never a bare 'module not found'."""
    new = "pkg://dyngen." + old[len("pkg://"):].replace("/", ".")
    with pytest.raises(GeneratorNotFoundError, match=re.escape(new)):
        build_generator({"path": old, "name": "AnyClass"})


def test_the_public_api_is_the_package_root() -> None:
    import dyngen
    from dyngen.generators.base import AbstractDataGenerator, MockDataGenerator

    assert dyngen.AbstractDataGenerator is AbstractDataGenerator
    assert dyngen.MockDataGenerator is MockDataGenerator
    assert sorted(dyngen.__all__) == sorted(dyngen._public_api)
    for name in dyngen.__all__:
        assert getattr(dyngen, name).__name__ == name
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        dyngen.nothing  # noqa: B018
