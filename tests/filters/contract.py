"""Behaviour every row filter must show; inherit FilterContract to run it.

A subclass says how to build its filter and gives rows it keeps and rows it drops (with
the reason it drops them for); the suite checks the contract the round relies on.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from dyngen.filters import RowBatch, RowFilter, run_filters


class FilterContract:
    """Contract suite: subclass as ``Test<Name>`` and implement the three methods."""

    # The reason the filter gives for `rows_to_drop`.
    dropped_reason: str = "filtered"

    def make_filter(self, tmp_path: Path) -> RowFilter:
        """Return the filter under test (tmp_path for filters that need a store)."""
        raise NotImplementedError("subclasses of FilterContract implement make_filter")

    def rows_to_keep(self) -> list[dict[str, Any]]:
        """Rows the filter keeps."""
        raise NotImplementedError("subclasses of FilterContract implement rows_to_keep")

    def rows_to_drop(self) -> list[dict[str, Any]]:
        """Rows the filter drops, each for `dropped_reason`."""
        raise NotImplementedError("subclasses of FilterContract implement rows_to_drop")

    @pytest.fixture
    def row_filter(self, tmp_path: Path) -> RowFilter:
        """The filter under test, built fresh for each test."""
        return self.make_filter(tmp_path)

    def mixed(self) -> list[dict[str, Any]]:
        """Kept and dropped rows interleaved, kept first."""
        keep, drop = self.rows_to_keep(), self.rows_to_drop()
        out: list[dict[str, Any]] = []
        for i in range(max(len(keep), len(drop))):
            out += keep[i : i + 1] + drop[i : i + 1]
        return out

    def test_is_a_row_filter(self, row_filter: RowFilter) -> None:
        assert isinstance(row_filter, RowFilter)

    def test_keeps_and_drops_with_its_reason(self, row_filter: RowFilter) -> None:
        keep, drop = self.rows_to_keep(), self.rows_to_drop()
        assert keep and drop, "give at least one row to keep and one to drop"
        verdicts = row_filter.verdicts(RowBatch(keep + drop))
        assert verdicts[: len(keep)] == [None] * len(keep)
        for verdict in verdicts[len(keep) :]:
            assert verdict is not None and verdict[0] == self.dropped_reason
            assert isinstance(verdict[1], str) and verdict[1].strip(), "say why, in words"

    def test_one_verdict_per_row_and_none_for_no_rows(self, row_filter: RowFilter) -> None:
        rows = self.mixed()
        assert len(row_filter.verdicts(RowBatch(rows))) == len(rows)
        assert row_filter.verdicts(RowBatch([])) == []

    def test_rows_from_arrow_get_the_same_verdicts(self, row_filter: RowFilter,
                                                   tmp_path: Path) -> None:
        # A generator's datasets.Dataset reaches the filters as an Arrow table.
        rows = self.mixed()
        as_list = row_filter.verdicts(RowBatch(rows))
        fresh = self.make_filter(tmp_path / "again")
        assert fresh.verdicts(RowBatch(pa.Table.from_pylist(rows))) == as_list

    def test_does_not_change_the_rows(self, row_filter: RowFilter) -> None:
        rows = self.mixed()
        before = copy.deepcopy(rows)
        row_filter.verdicts(RowBatch(rows))
        assert rows == before

    def test_dropped_rows_are_quarantined_and_counted(self, row_filter: RowFilter) -> None:
        rows = self.mixed()
        out = run_filters(rows, [row_filter])
        dropped = len(self.rows_to_drop())
        assert len(out.kept) + len(out.rejected) == len(rows)
        assert out.rejected_by_reason == {self.dropped_reason: dropped}
        # Each dropped row is kept as it came, in order, with the reason.
        assert [json.loads(r["row"]) for r in out.rejected] == \
            json.loads(json.dumps(self.rows_to_drop()))
        stats = out.by_filter[type(row_filter).__name__]
        assert stats["seen"] == len(rows)
        assert stats["kept"] == len(rows) - dropped
        assert stats[f"dropped_{self.dropped_reason}"] == dropped

    def test_finish_keeps_every_kept_row(self, row_filter: RowFilter) -> None:
        kept = RowBatch(self.rows_to_keep())
        assert len(row_filter.finish(kept)) == len(kept)
