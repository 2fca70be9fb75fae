"""check_before_start: everything a round's config names, checked before anything starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dyngen.config.preflight import check_before_start, misspelt_location_keys, one_edit_apart
from dyngen.errors import (
    ConfigError,
    DatasetNotFoundError,
    GeneratorClassNotFoundError,
    GeneratorNotFoundError,
)
from dyngen.store import Store
from tests.rows import verl_rows
from tests.support import write

GENERATOR = '''
    import datasets

    from dyngen import AbstractDataGenerator


    class Counting(AbstractDataGenerator):
        defaults = {"rows": 2}

        def generate(self, dataset, context=None):
            return datasets.Dataset.from_list([])


    class ReadsItsConfig(AbstractDataGenerator):
        def generate(self, dataset, context=None):
            return datasets.Dataset.from_list([])
'''
FILTER = '''
    from dyngen import RowFilter


    class KeepAll(RowFilter):
        def check(self, rows):
            return [None for _ in rows]
'''


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    write(tmp_path / "gens.py", GENERATOR)
    write(tmp_path / "my_filters.py", FILTER)
    Store(tmp_path / "store").create("my-data", verl_rows(2))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def config(folder: Path, **datagen: Any) -> dict[str, Any]:
    return {"store": {"root": str(folder / "store")},
            "data": {"datagen": {"path": "gens.py", "name": "Counting", **datagen}}}


def test_a_config_that_can_run_passes(folder: Path) -> None:
    cfg = config(folder, rows=3)
    cfg["round"] = {"filters": [{"path": "my_filters.py", "name": "KeepAll"}]}
    check_before_start(cfg, dataset="my-data")


@pytest.mark.parametrize(("datagen", "error", "wanted"), [
    ({"path": "gen.py"}, GeneratorNotFoundError, "Did you mean gens.py?"),
    ({"name": "Countng"}, GeneratorClassNotFoundError, "Did you mean 'Counting'?"),
    ({"rowz": 3}, ConfigError, "Did you mean data.datagen.rows?"),
    ({"rows": "many"}, ConfigError, "data.datagen.rows: expected an integer"),
])
def test_each_generator_mistake_is_named(folder: Path, datagen: dict[str, Any],
                                         error: type[Exception], wanted: str) -> None:
    with pytest.raises(error, match=wanted.replace("?", r"\?").replace(".", r"\.")):
        check_before_start(config(folder, **datagen))


def test_a_misspelt_name_key_is_named_before_the_default_class_is_looked_for(
        folder: Path) -> None:
    cfg = config(folder)
    del cfg["data"]["datagen"]["name"]
    cfg["data"]["datagen"]["nmae"] = "Counting"
    with pytest.raises(ConfigError, match=r"unknown key data\.datagen\.nmae.*Did you mean "
                                          r"data\.datagen\.name=Counting\?"):
        check_before_start(cfg)


def test_a_generators_own_key_close_to_path_or_name_is_left_alone(folder: Path) -> None:
    assert misspelt_location_keys({"math": 3, "names": ["a"], "nmae": "Counting",
                                   "pth": "gens.py"}) == {"nmae": "name", "pth": "path"}
    check_before_start(config(folder, name="ReadsItsConfig", math=3))


def test_one_edit_apart() -> None:
    assert [one_edit_apart(a, "name") for a in ("nmae", "nam", "names", "nxme", "mane")] \
        == [True, True, True, True, False]


def test_a_filter_class_typo_and_a_missing_tokenizer_are_caught(folder: Path) -> None:
    cfg = config(folder)
    cfg["round"] = {"filters": [{"path": "my_filters.py", "name": "KeepAl"}]}
    with pytest.raises(GeneratorClassNotFoundError,
                       match=r"round\.filters\[0\]\.name.*Did you mean 'KeepAll'\?"):
        check_before_start(cfg)
    cfg = config(folder)
    cfg["data"].update(filter_overlong_prompts=True, tokenizer=str(folder / "no-such-model"))
    with pytest.raises(ConfigError, match="data.tokenizer: expected a local tokenizer folder"):
        check_before_start(cfg)


def test_a_missing_dataset_is_refused_with_its_store(folder: Path) -> None:
    with pytest.raises(DatasetNotFoundError) as caught:
        check_before_start(config(folder), dataset="my-dta")
    assert caught.value.dataset == "my-dta"
    assert caught.value.store.list_datasets() == ["my-data"]  # the CLI suggests from it


@pytest.mark.usefixtures("prefect_server")
def test_the_rounds_first_step_checks_the_config_and_commits_nothing(folder: Path) -> None:
    from dyngen.flows.generation_round import generation_round

    with pytest.raises(ConfigError, match=r"Did you mean data\.datagen\.rows\?") as caught:
        generation_round("my-data", config(folder, rowz=3), {"step": 1})
    assert caught.value.dyngen_stage == "check"
    assert Store(folder / "store").head("my-data").version == 0
