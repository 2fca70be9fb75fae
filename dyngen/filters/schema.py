"""The schema filter: verl's row schema, then the dataset's own Arrow schema, then a bound
on row size.

Rows that came as an Arrow table are checked column by column; single rows are looked at
only where a column says one may be bad, so a million rows cost seconds, not a million
dicts.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dyngen.errors import SchemaMismatchError
from dyngen.filters.base import RowFilter, Verdict
from dyngen.rows import Row, RowBatch
from dyngen.store import PROVENANCE_COLUMNS

# One test of list types for the store and this filter (the store's, which writes them).
from dyngen.store.shards import conform, is_list, table_from_dicts

# Far above any prompt a model trains on (a 128k-token context is well under 1 MiB of
# text), yet small enough that one junk row cannot stall a round: tokenizing 20 MB of
# text takes ~25 s and ~3 GB of memory, and verl's default `truncation: error` would stop
# training at such a row if the over-long filter is off.
MAX_ROW_BYTES = 8 << 20


class SchemaFilter(RowFilter):
    """verl's row schema, then the dataset's own Arrow schema, then a bound on row size."""

    reason = "schema"
    too_large = "too_large"

    def __init__(self, schema: pa.Schema, prompt_key: str = "prompt",
                 max_row_bytes: int = MAX_ROW_BYTES) -> None:
        super().__init__(None)
        self.schema = schema
        self.prompt_key = prompt_key
        self.max_row_bytes = max_row_bytes

    def check(self, rows: Sequence[Row]) -> list[Verdict]:
        """(schema or too_large, detail) for each row that breaks a rule, else None."""
        table = rows.table if isinstance(rows, RowBatch) else None
        suspects = self._suspects(table) if table is not None else None
        if suspects is None:
            return self._row_verdicts(list(rows))
        # The columns say which rows may break a rule; only those are looked at one by one.
        out: list[Verdict] = [None] * len(rows)
        idx = np.flatnonzero(suspects).tolist()
        if idx:
            some = table.take(pa.array(idx, pa.int64())).to_pylist()
            for i, verdict in zip(idx, self._row_verdicts(some), strict=True):
                out[i] = verdict
        return out

    def finish(self, kept: RowBatch) -> RowBatch:
        """The kept rows in the dataset's schema, as the store writes them."""
        return RowBatch(self.stored(kept))

    def stored(self, rows: Sequence[Row]) -> pa.Table:
        """Rows that passed this filter, in the dataset's schema, as the store writes them."""
        table = rows.table if isinstance(rows, RowBatch) else None
        if table is not None and self._same_kind(table):
            return conform(_without_provenance(table), self.schema)
        rows = list(rows)
        out = self._conformed(rows)
        if isinstance(out, pa.Table):
            return out
        # Each row fits on its own, but Arrow found no one type for a field of all of them
        # (e.g. an index 1 in one row and "2" in another): conform them one at a time.
        return pa.concat_tables([self._conformed([r]) for r in rows])  # type: ignore[misc]

    # ---- one row at a time
    def _row_verdicts(self, rows: list[Row]) -> list[Verdict]:
        out: list[Verdict] = []
        for row in rows:
            detail = self._check_row(row)
            out.append(None if detail is None else (self.reason, detail))
        ok = [i for i, v in enumerate(out) if v is None]
        if not ok:
            return out
        table = self._conformed([rows[i] for i in ok])
        if isinstance(table, pa.Table):
            for i, verdict in zip(ok, self._size_verdicts(table), strict=True):
                out[i] = verdict
            return out
        for i in ok:  # some row does not fit the dataset's types: find which
            one = self._conformed([rows[i]])
            out[i] = (self.reason, one) if isinstance(one, str) else self._size_verdicts(one)[0]
        return out

    def _check_row(self, row: Row) -> str | None:
        known = set(self.schema.names) - set(PROVENANCE_COLUMNS)
        unknown = sorted(set(row) - known - set(PROVENANCE_COLUMNS))
        if unknown:
            return f"unknown columns {unknown}; the dataset has {sorted(known)}"
        for col, kind in (("data_source", str), ("ability", str)):
            if col in self.schema.names and not isinstance(row.get(col), kind):
                return f"{col} must be a string, found {_kind(row.get(col))}"
        problem = check_prompt(row.get(self.prompt_key), self.prompt_key)
        if problem:
            return problem
        reward = row.get("reward_model")
        if not isinstance(reward, Mapping):
            return f"reward_model must be a dict with style and ground_truth, found {_kind(reward)}"
        if not isinstance(reward.get("style"), str):
            return f"reward_model.style must be a string, found {_kind(reward.get('style'))}"
        truth = reward.get("ground_truth")
        # numbers.Real: numpy's float32 NaN is not a Python float, and must not slip through.
        if truth is None or (isinstance(truth, numbers.Real) and not isinstance(truth, bool)
                             and not math.isfinite(truth)):
            return f"reward_model.ground_truth must be a finite value, found {truth!r}"
        extra = row.get("extra_info")
        if extra is not None and not isinstance(extra, Mapping):
            return f"extra_info must be a dict, found {_kind(extra)}"
        return None

    def _conformed(self, rows: list[Row]) -> pa.Table | str:
        """The rows as one table in the dataset's schema, or why they do not fit it."""
        clean = [{k: v for k, v in r.items() if k not in PROVENANCE_COLUMNS} for r in rows]
        try:
            return conform(table_from_dicts(_stringify_truth(clean, self.schema)),
                           self.schema)
        except UnicodeEncodeError as exc:
            bad = exc.object[exc.start:exc.end] if isinstance(exc.object, str) else "?"
            return (f"a string is not valid UTF-8 text ({exc.reason}: {bad!r}); decode "
                    "generated bytes with errors='replace' or drop them")
        except (pa.ArrowException, SchemaMismatchError, TypeError, ValueError) as exc:
            return f"does not fit the dataset's schema: {exc}"

    def _size_verdicts(self, table: pa.Table) -> list[Verdict]:
        return [None if n <= self.max_row_bytes else (
                    self.too_large, f"the row holds {n:,} bytes of data, over the limit of "
                    f"{self.max_row_bytes:,}; shorten it (prompts are limited in tokens by "
                    "data.max_prompt_length) or pass large inputs as a file path")
                for n in row_bytes(table).tolist()]

    # ---- whole columns at once
    def _same_kind(self, table: pa.Table) -> bool:
        """Whether every column holds the Python values the dataset's column would hold."""
        names = set(self.schema.names)
        return all(f.name in names and _same_kind(f.type, self.schema.field(f.name).type)
                   for f in _without_provenance(table).schema)

    def _suspects(self, table: pa.Table) -> np.ndarray | None:
        """Rows that may break a rule, or None where only a row-by-row check can tell.

        A row not marked passes every row check: the marks are null, empty or blank values,
        non-finite ground truths and large rows, on columns already of the dataset's types.
        """
        if not self._same_kind(table):
            return None  # numbers as text, extra fields, ...: the row checks explain each
        try:
            data = conform(_without_provenance(table), self.schema)
        except (pa.ArrowException, SchemaMismatchError):
            return None
        names = set(self.schema.names)
        if self.prompt_key not in names or "reward_model" not in names:
            return None
        if "extra_info" in names and not pa.types.is_struct(self.schema.field("extra_info").type):
            return None
        marks = [_prompt_suspects(data.column(self.prompt_key).combine_chunks()),
                 _reward_suspects(data.column("reward_model").combine_chunks())]
        for col in ("data_source", "ability"):
            if col in names:
                marks.append(_is_null(data.column(col).combine_chunks())
                             if _is_text(self.schema.field(col).type) else None)
        if any(m is None for m in marks):
            return None
        return np.logical_or.reduce([*marks, row_bytes(data) > self.max_row_bytes])


def _without_provenance(table: pa.Table) -> pa.Table:
    return table.drop_columns([c for c in PROVENANCE_COLUMNS if c in table.column_names])


def _same_kind(src: pa.DataType, dst: pa.DataType) -> bool:
    """Whether values of type `src` read as the same Python values once cast to `dst`.

    Reordered or missing struct fields and string/list offset widths qualify; casts that
    parse text or change numbers do not (the row checks judge those values as they came).
    """
    if pa.types.is_null(src) or src == dst or (_is_text(src) and _is_text(dst)):
        return True
    if pa.types.is_struct(src) and pa.types.is_struct(dst):
        fields = {dst.field(i).name: dst.field(i).type for i in range(dst.num_fields)}
        return all(src.field(i).name in fields
                   and _same_kind(src.field(i).type, fields[src.field(i).name])
                   for i in range(src.num_fields))
    if is_list(src) and is_list(dst):
        return _same_kind(src.value_type, dst.value_type)
    return False


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _is_null(arr: pa.Array) -> np.ndarray:
    return arr.is_null().to_numpy(zero_copy_only=False)


@lru_cache(maxsize=1)
def _whitespace() -> str:
    """Every character `str.strip()` removes, for the same test in Arrow."""
    # All are in the Basic Multilingual Plane (the last, U+3000): scanning it takes
    # milliseconds, all of Unicode a fifth of a second, in every process that filters.
    return "".join(c for c in map(chr, range(0x10000)) if c.isspace())


def _blank(arr: pa.Array) -> np.ndarray:
    """Null, or nothing but whitespace (as `not value.strip()` tests it)."""
    length = pc.utf8_length(pc.utf8_trim(arr, characters=_whitespace()))
    return pc.equal(pc.fill_null(length, 0), 0).to_numpy(zero_copy_only=False)


def _prompt_suspects(arr: pa.Array) -> np.ndarray | None:
    """Prompts that are null or empty, or hold a null message or a blank role or content."""
    kind = arr.type
    if not is_list(kind) or not pa.types.is_struct(kind.value_type):
        return None
    fields = {kind.value_type.field(i).name: kind.value_type.field(i).type
              for i in range(kind.value_type.num_fields)}
    if not all(_is_text(fields.get(f, pa.null())) for f in ("role", "content")):
        return None
    lengths = pc.fill_null(arr.value_lengths(), 0).to_numpy(zero_copy_only=False)
    bad = _is_null(arr) | (lengths == 0)
    messages = arr.flatten()  # the values of non-null lists, in order
    parents = np.repeat(np.arange(len(arr)), lengths)
    bad_message = (_is_null(messages) | _blank(pc.struct_field(messages, "role"))
                   | _blank(pc.struct_field(messages, "content")))
    bad[parents[bad_message]] = True
    return bad


def _reward_suspects(arr: pa.Array) -> np.ndarray | None:
    """reward_model values that are null, or whose style or ground truth is null or not finite."""
    kind = arr.type
    if not pa.types.is_struct(kind) or kind.get_field_index("style") < 0 \
            or kind.get_field_index("ground_truth") < 0:
        return None
    if not _is_text(kind.field("style").type):
        return None
    truth = pc.struct_field(arr, "ground_truth")
    bad = _is_null(arr) | _is_null(pc.struct_field(arr, "style")) | _is_null(truth)
    if pa.types.is_floating(truth.type):
        bad |= ~pc.fill_null(pc.is_finite(truth), False).to_numpy(zero_copy_only=False)
    return bad


def row_bytes(table: pa.Table) -> np.ndarray:
    """Bytes of data in each row: text, binary and fixed-width values, in lists and structs
    too (the types a dataset's schema holds; others, such as maps, count nothing)."""
    total = np.zeros(table.num_rows, dtype=np.int64)
    for column in table.columns:
        start = 0
        for chunk in column.chunks:
            _add_bytes(chunk, np.arange(start, start + len(chunk)), total)
            start += len(chunk)
    return total


def _add_bytes(arr: pa.Array, rows: np.ndarray, total: np.ndarray) -> None:
    kind = arr.type
    if not len(arr):
        return
    if is_list(kind):
        lengths = pc.fill_null(arr.value_lengths(), 0).to_numpy(zero_copy_only=False)
        _add_bytes(arr.flatten(), np.repeat(rows, lengths), total)
        return
    if pa.types.is_struct(kind):
        for i in range(kind.num_fields):
            _add_bytes(arr.field(i), rows, total)
        return
    if _is_text(kind) or pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        sizes = pc.fill_null(pc.binary_length(arr), 0).to_numpy(zero_copy_only=False)
    elif pa.types.is_primitive(kind):
        sizes = np.full(len(arr), max(kind.bit_width // 8, 1))
    else:
        return
    total += np.bincount(rows, weights=sizes, minlength=len(total)).astype(np.int64)


def check_prompt(prompt: Any, key: str = "prompt") -> str | None:
    """Why `prompt` is not a non-empty list of {role: str, content: non-empty str}, or None."""
    if isinstance(prompt, str):
        return f"{key} is a plain string; expected a list of {{role, content}} messages"
    if not isinstance(prompt, list) or not prompt:
        return f"{key} must be a non-empty list of messages, found {_kind(prompt)}"
    for i, msg in enumerate(prompt):
        if not isinstance(msg, Mapping):
            return f"{key}[{i}] must be a dict with role and content, found {_kind(msg)}"
        if not isinstance(msg.get("role"), str) or not msg["role"].strip():
            return f"{key}[{i}].role must be a non-empty string, found {_kind(msg.get('role'))}"
        content = msg.get("content")
        if not isinstance(content, str):
            return f"{key}[{i}].content must be a string, found {_kind(content)}"
        if not content.strip():
            return f"{key}[{i}].content is empty"
    return None


def _stringify_truth(rows: list[Row], schema: pa.Schema) -> list[Row]:
    """Numbers as ground truth are unambiguous: store them as text when the dataset does."""
    if "reward_model" not in schema.names:
        return rows
    kind = schema.field("reward_model").type
    if not pa.types.is_struct(kind) or kind.get_field_index("ground_truth") < 0:
        return rows
    if not pa.types.is_string(kind.field("ground_truth").type):
        return rows
    out = []
    for r in rows:
        truth = r.get("reward_model", {}).get("ground_truth")
        if isinstance(truth, numbers.Real) and not isinstance(truth, bool):
            r = {**r, "reward_model": {**r["reward_model"], "ground_truth": str(truth)}}
        out.append(r)
    return out


def _kind(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'…' if len(text) > 60 else ''}"
