"""DyngenCallback takes (store_root, dataset) like FollowingDataset and DyngenDataset; the
old order (dataset, store_root) still works, with a one-line FutureWarning."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

from dyngen.store import Store
from dyngen.trainers.trl import DyngenCallback, FollowingDataset
from tests.rows import verl_rows


def made(*args: Any, **kwargs: Any) -> tuple[DyngenCallback, list[str]]:
    """The callback, and the messages of the FutureWarnings its construction gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        callback = DyngenCallback(*args, **kwargs)
    return callback, [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]


def where(callback: DyngenCallback) -> tuple[str, str]:
    return str(Path(callback.source.store.root).resolve()), callback.dataset


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`dyngen_store` in the current folder, with the dataset `ds`."""
    monkeypatch.chdir(tmp_path)
    Store(tmp_path / "dyngen_store").create("ds", verl_rows(2))
    return tmp_path / "dyngen_store"


@pytest.mark.parametrize("args", [("dyngen_store", "ds"), ("./dyngen_store", "ds"),
                                  ("path", "ds"), (None, "ds")])
def test_the_new_order_is_the_datasets_order_and_says_nothing(
        store: Path, args: tuple[Any, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DYNGEN_STORE_ROOT", str(store))
    root = store if args[0] == "path" else args[0]
    callback, said = made(root, args[1])
    assert said == []
    assert where(callback) == (str(store), "ds")
    following = FollowingDataset(root, "ds")  # the same two arguments, the same place
    assert Path(following.store_root).resolve() == store


def test_keywords_say_which_is_which(store: Path) -> None:
    callback, said = made(dataset="ds", store_root="dyngen_store")
    assert said == [] and where(callback) == (str(store), "ds")


@pytest.mark.parametrize("args", [("ds", "dyngen_store"), ("ds", "path"), ("ds", "./dyngen_store"),
                                  ("ds",)])
def test_the_old_order_still_works_with_a_one_line_warning(
        store: Path, args: tuple[str, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DYNGEN_STORE_ROOT", str(store))  # the one-argument form's store
    args = tuple(store if a == "path" else a for a in args)
    callback, said = made(*args)
    assert where(callback) == (str(store), "ds")
    assert len(said) == 1 and "\n" not in said[0]
    assert "'ds'" in said[0] and "DyngenCallback(store_root, dataset)" in said[0]


def test_two_stores_each_holding_the_other_name_are_read_in_the_new_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ambiguous names: store `a` holds a dataset `b` and store `b` a dataset `a`; the
    documented order decides."""
    monkeypatch.chdir(tmp_path)
    Store(tmp_path / "a").create("b", verl_rows(2))
    Store(tmp_path / "b").create("a", verl_rows(2))
    callback, said = made("a", "b")
    assert said == [] and where(callback) == (str(tmp_path / "a"), "b")


def test_no_dataset_is_refused(store: Path) -> None:
    from dyngen.errors import ConfigError

    with pytest.raises(ConfigError, match="expected a dataset name"):
        DyngenCallback()
