"""Programs the model checker (tests/store/test_model_store.py) found failing, kept as
explicit regression tests."""

from __future__ import annotations

from pathlib import Path

from dyngen.store import Store, verify
from tests.rows import verl_rows


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
