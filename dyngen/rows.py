"""Rows on their way from a generator to the store: the transport type and its readers.

A generator may return rows several ways; `rows_from_output` takes each unambiguous one
as a `RowBatch`, which keeps a `datasets.Dataset` or Arrow table in Arrow (the filters
read it by column) and is one opaque value for Prefect to hand from task to task.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, overload

import datasets
import pyarrow as pa

from dyngen.errors import GeneratorOutputError
from dyngen.store.shards import to_table

Row = dict[str, Any]


class RowBatch(Sequence[Row]):
    """Rows on their way through the filters: a list, or an Arrow table read lazily.

    Deliberately not a list: Prefect walks every list and dict handed to a task, item by
    item, which at a million rows takes many minutes; a RowBatch is one opaque value.
    """

    __hash__ = None  # type: ignore[assignment]  # compared by rows, like a list

    def __init__(self, rows: Sequence[Any] | pa.Table,
                 quarantined: Sequence[dict[str, str]] = ()) -> None:
        self._table = rows if isinstance(rows, pa.Table) else None
        self._rows: list[Any] | None = None if self._table is not None else list(rows)
        # Rows the generator itself refused ({reason, detail, row as JSON}): not rows to
        # filter, but rows the round quarantines with the filters' rejections.
        self.quarantined: list[dict[str, str]] = list(quarantined)

    @property
    def table(self) -> pa.Table | None:
        """The Arrow table the rows are read from, if they came as one."""
        return self._table

    def __len__(self) -> int:
        return len(self._rows) if self._rows is not None else self._table.num_rows

    @overload
    def __getitem__(self, i: int) -> Row: ...
    @overload
    def __getitem__(self, i: slice) -> RowBatch: ...
    def __getitem__(self, i: int | slice) -> Row | RowBatch:
        if isinstance(i, slice):
            return self.take(range(*i.indices(len(self))))
        if self._rows is not None:
            return self._rows[i]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"row {i} of a batch of {n}")
        return self._table.slice(i % n, 1).to_pylist()[0]

    def __iter__(self) -> Iterator[Row]:
        return iter(self.to_list())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (RowBatch, list, tuple)):
            return len(self) == len(other) and self.to_list() == list(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"RowBatch({len(self)} rows{' in Arrow' if self._table is not None else ''})"

    def to_list(self) -> list[Any]:
        """Every row as a Python dict (converted once, then kept)."""
        if self._rows is None:
            self._rows = self._table.to_pylist()
        return self._rows

    def column(self, name: str) -> list[Any]:
        """One field of every row (None where a row lacks it)."""
        if self._table is not None:
            if name not in self._table.column_names:
                return [None] * len(self)
            return self._table.column(name).to_pylist()
        return [r.get(name) if isinstance(r, Mapping) else None for r in self.to_list()]

    def take(self, indices: Sequence[int]) -> RowBatch:
        """The rows at `indices`, in that order."""
        if self._table is not None:
            if len(indices) == len(self) and list(indices) == list(range(len(self))):
                return self
            return RowBatch(self._table.take(pa.array(indices, pa.int64())))
        rows = self.to_list()
        return RowBatch([rows[i] for i in indices])

    def for_store(self) -> pa.Table | list[Any]:
        """What `Store.prepare_append` takes: the Arrow table, or the list of rows."""
        return self._table if self._table is not None else self.to_list()


def column_of(rows: Sequence[Row], key: str) -> list[Any]:
    """`row[key]` of every row; read as one Arrow column when the rows are in a table."""
    return rows.column(key) if isinstance(rows, RowBatch) else [r[key] for r in rows]


def rows_from_output(result: Any, generator: str) -> RowBatch:
    """Take a generator's return value as rows where that is unambiguous, else fail.

    A `datasets.Dataset` or Arrow table stays in Arrow (the filters read it by column).
    """
    expected = "expected a datasets.Dataset of new rows in verl's schema"
    if isinstance(result, (datasets.Dataset, pa.Table)):
        return RowBatch(to_table(result))
    if isinstance(result, (list, tuple)):
        return RowBatch(result)
    if type(result).__module__.startswith("pandas") and hasattr(result, "to_dict"):
        return RowBatch(result.to_dict("records"))
    if isinstance(result, Mapping):
        columns = list(result.values())
        if columns and all(isinstance(c, list) for c in columns):
            lengths = {str(k): len(c) for k, c in result.items()}
            if len(set(lengths.values())) == 1:
                return RowBatch([dict(zip(result.keys(), vals, strict=True))
                                 for vals in zip(*columns, strict=True)])
            raise GeneratorOutputError(
                f"generator {generator} returned a dict of columns of unequal lengths "
                f"{dict(list(lengths.items())[:8])}; {expected}, or a dict of equal-length "
                "column lists.")
        raise GeneratorOutputError(
            f"generator {generator} returned a dict with keys {list(result)[:8]}; {expected} "
            "(a dict of equal-length column lists is also accepted)."
        )
    shown = "None" if result is None else f"a {type(result).__name__}"
    raise GeneratorOutputError(
        f"generator {generator} returned {shown}; {expected}. Return only the new rows, e.g. "
        "the list of row dicts itself (datasets.Dataset.from_list(rows) would keep only the "
        "columns of the first row).")
