"""Store.to_arrow: a version's rows as one Arrow table over the memory-mapped shards, which
DuckDB and Polars query in place."""

from __future__ import annotations

from pathlib import Path

import duckdb
import polars
import pyarrow as pa
import pytest

from dyngen.errors import VersionVacuumedError
from dyngen.store import Store
from tests.rows import verl_row_with, verl_rows


@pytest.fixture
def store(tmp_path: Path) -> Store:
    store = Store(tmp_path / "store")
    store.create("ds", verl_rows(3000))
    store.append("ds", verl_rows(2, start=5000, source="gen"), generator="Gen")
    return store


def test_rows_are_the_versions_rows_in_the_same_order(store: Store) -> None:
    for version in (0, 1):
        table = store.to_arrow("ds", version)
        assert isinstance(table, pa.Table)
        assert table.to_pylist() == store.load("ds", version).to_list()
    assert store.to_arrow("ds").num_rows == 3002  # the head by default


def test_no_row_is_copied(store: Store) -> None:
    store.to_arrow("ds")  # the shards' first opening and checksums are not what is measured
    before = pa.total_allocated_bytes()
    table = store.to_arrow("ds")
    assert pa.total_allocated_bytes() == before  # every buffer is the memory-mapped file's
    assert table.nbytes > 300_000


def test_duckdb_and_polars_query_it_in_place(store: Store) -> None:
    tbl = store.to_arrow("ds")
    counts = duckdb.sql("select data_source, count(*) as n from tbl group by data_source "
                        "order by data_source").fetchall()
    assert counts == [("gen", 2), ("seed", 3000)]
    frame = polars.from_arrow(tbl, rechunk=False)
    assert frame.filter(polars.col("_dyngen_version") == 1)["data_source"].to_list() == \
        ["gen", "gen"]


def test_fields_a_round_adds_read_as_null_in_older_shards(store: Store) -> None:
    store.append("ds", [verl_row_with(9000, extra_info={"index": 9000, "split": "t",
                                                        "model": "m"})])
    store.to_arrow("ds")
    before = pa.total_allocated_bytes()
    table = store.to_arrow("ds")
    # Only the new field is made for the older rows (a null string: offsets and validity);
    # their other extra_info fields and every other column stay the mapped file's.
    assert pa.total_allocated_bytes() - before < 8 * 3002
    models = table.column("extra_info").combine_chunks().field("model").to_pylist()
    assert models == [None] * 3002 + ["m"]
    assert [f.name for f in store.to_arrow("ds", 1).schema.field("extra_info").type] == \
        ["index", "split"]


def test_a_version_retention_removed_is_refused(store: Store) -> None:
    store.compact("ds", full=True)
    store.vacuum("ds", keep_versions=1, grace_seconds=0)
    with pytest.raises(VersionVacuumedError, match="version 0 of dataset 'ds' was removed"):
        store.to_arrow("ds", 0)
