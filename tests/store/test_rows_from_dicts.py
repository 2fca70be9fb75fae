"""Rows given as dicts keep every key of every row, not only the first row's (issue #30,
defect 2): in `create`, in `append`, and on a round's way from a generator to the store."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from dyngen.errors import GeneratorOutputError, SchemaMismatchError
from dyngen.filters import SchemaFilter, run_filters
from dyngen.rows import rows_from_output
from dyngen.store import Store, verify
from dyngen.store.shards import schema_from_json
from tests.rows import verl_row, verl_row_with, verl_rows

PARTIAL = {"data_source": "d", "prompt": [{"role": "user", "content": "Only a prompt"}]}


def test_append_keeps_keys_the_first_row_lacks(open_store: Callable[..., Store]) -> None:
    store = open_store()
    store.create("ds", verl_rows(1))
    store.append("ds", [PARTIAL, verl_row(1)], compact=False)
    for reader in (store, open_store()):
        rows = reader.load("ds").to_list()
        assert rows[2]["ability"] == "math"
        assert rows[2]["reward_model"] == {"style": "rule", "ground_truth": "2"}
        assert rows[2]["extra_info"] == {"index": 1, "split": "train"}
        assert rows[1]["ability"] is None and rows[1]["reward_model"] is None
    assert verify(store, "ds") == []


def test_create_takes_every_rows_columns_in_the_order_first_seen(
        open_store: Callable[..., Store]) -> None:
    store = open_store()
    store.create("ds", [PARTIAL, verl_row(1)])
    assert list(store.load("ds").features)[:5] == [
        "data_source", "prompt", "ability", "reward_model", "extra_info"]
    store.append("ds", [verl_row(2)], compact=False)  # not refused as a "new column"
    assert open_store().load("ds")["extra_info"] == [None, {"index": 1, "split": "train"},
                                                      {"index": 2, "split": "train"}]


def test_a_key_the_schema_lacks_is_refused_wherever_it_appears(
        open_store: Callable[..., Store]) -> None:
    store = open_store()
    store.create("ds", verl_rows(1))
    with pytest.raises(SchemaMismatchError, match="surprise"):
        store.append("ds", [verl_row(1), {**verl_row(2), "surprise": 1}])
    assert open_store().head_version("ds") == 0


def test_a_generators_list_of_dicts_keeps_every_key_through_the_filters(
        tmp_path: Path) -> None:
    store = Store(tmp_path)
    schema = schema_from_json(store.create("ds", verl_rows(1)).schema)
    first = verl_row(1)
    del first["extra_info"]  # optional: the schema filter keeps the row
    batch = rows_from_output([first, verl_row(2)], "Gen")
    out = run_filters(batch, [SchemaFilter(schema)])
    table = SchemaFilter(schema).stored(out.kept)
    assert table.column("extra_info").to_pylist() == [None, {"index": 2, "split": "train"}]


def test_a_generator_returning_nothing_is_told_to_return_its_list_of_rows() -> None:
    with pytest.raises(GeneratorOutputError) as err:
        rows_from_output(None, "Gen")
    assert "the list of row dicts itself" in str(err.value)
    assert "would keep only the columns of the first row" in str(err.value)


@pytest.mark.parametrize("change,column", [
    ({"extra_info.index": "7"}, "extra_info.index is string, the dataset's is int64"),
    ({"data_source": 3}, "data_source is int64, the dataset's is string"),
    ({"extra_info.index": 2.5}, "extra_info.index is double, the dataset's is int64"),
])
def test_a_value_of_another_kind_is_refused_not_converted(tmp_path: Path, change: dict,
                                                           column: str) -> None:
    store = Store(tmp_path)
    store.create("ds", verl_rows(1))
    with pytest.raises(SchemaMismatchError) as err:
        store.append("ds", [verl_row_with(1, **change)])
    assert column in str(err.value) and "converts no value" in str(err.value)
    assert Store(tmp_path).head_version("ds") == 0


def test_value_keeping_casts_are_made(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.create("ds", [verl_row_with(0, extra_info={"index": 0, "score": 0.5})])
    row = verl_row_with(1, extra_info={"score": 2, "index": 1})  # an int into a float
    store.append("ds", [row], compact=False)
    assert Store(tmp_path).load("ds")["extra_info"][1] == {"index": 1, "score": 2.0}


def test_the_built_in_generators_rows_keep_every_rows_keys() -> None:
    import datasets

    from dyngen.generators.schema import rows_as_dataset

    first = verl_row(1)
    del first["ability"]
    ds = rows_as_dataset([first, verl_row(2)], datasets.Dataset.from_list(verl_rows(1)),
                         {}, fit_schema=False)
    assert ds["ability"] == [None, "math"]
