"""Programs the model checker (tests/store/test_model_store.py) found failing, kept as
explicit regression tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from dyngen.errors import SchemaMismatchError
from dyngen.store import Store, verify
from tests.rows import verl_row, verl_row_with, verl_rows


def test_rerunning_a_vacuum_by_days_commits_no_second_version(tmp_path: Path) -> None:
    # Found as: create, append, vacuum(keep_days=0), vacuum(keep_days=0): the second run
    # took its own first vacuum version for the head to keep and expired the data under it.
    store = Store(tmp_path)
    store.create("ds", verl_rows(1))
    store.append("ds", verl_rows(1, start=1))
    first = store.vacuum("ds", keep_days=0, grace_seconds=0)
    assert first.record is not None and first.expired_before == 1
    for _ in range(2):
        again = Store(tmp_path).vacuum("ds", keep_days=0, grace_seconds=0)
        assert (again.record, again.expired_before) == (None, 1)
    assert Store(tmp_path).head_version("ds") == 2
    assert Store(tmp_path).load("ds", 1).num_rows == 2  # the data version stays loadable
    assert verify(store, "ds") == []


def test_a_field_of_different_kinds_across_rows_is_refused_naming_it(tmp_path: Path) -> None:
    # Found as: create, then append [good row, row with extra_info.index "seven"] as dicts:
    # a raw pyarrow ArrowInvalid naming no column, not the store's SchemaMismatchError.
    store = Store(tmp_path)
    store.create("ds", verl_rows(1))
    for bad, column in ((verl_row_with(2, **{"extra_info.index": "seven"}), "extra_info"),
                        (verl_row_with(2, ability=7), "ability")):
        with pytest.raises(SchemaMismatchError,
                           match=f"column '{column}' holds values of different kinds"):
            store.append("ds", [verl_row(1), bad])
    assert Store(tmp_path).head_version("ds") == 0

