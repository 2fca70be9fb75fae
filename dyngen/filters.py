"""Row filters for generated rows: schema → over-long prompt → duplicate → user filters.

A filter answers, for each row, keep (None) or drop with a reason and a detail, as in
datatrove. The runner owns the loop and the bookkeeping: rejected rows are kept with
their reason (never silently lost) and counted per reason.

Rows a generator returns as a `datasets.Dataset` stay an Arrow table (a `RowBatch`): the
schema filter checks them column by column and looks at single rows only where a column
says one may be bad, so a million rows cost seconds, not a million dicts.
"""

from __future__ import annotations

import json
import math
import numbers
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dyngen.errors import SchemaMismatchError
from dyngen.store import PROVENANCE_COLUMNS, Store
from dyngen.store.keys import prompt_keys
from dyngen.store.shards import conform

Row = dict[str, Any]
Verdict = tuple[str, str] | None  # None keeps the row; (reason, detail) drops it

# Far above any prompt a model trains on (a 128k-token context is well under 1 MiB of
# text), yet small enough that one junk row cannot stall a round: tokenizing 20 MB of
# text takes ~25 s and ~3 GB of memory, and verl's default `truncation: error` would stop
# training at such a row if the over-long filter is off.
MAX_ROW_BYTES = 8 << 20


class RowBatch(Sequence[Row]):
    """Rows on their way through the filters: a list, or an Arrow table read lazily.

    Deliberately not a list: Prefect walks every list and dict handed to a task, item by
    item, which at a million rows takes many minutes; a RowBatch is one opaque value.
    """

    __hash__ = None  # type: ignore[assignment]  # compared by rows, like a list

    def __init__(self, rows: Sequence[Any] | pa.Table) -> None:
        self._table = rows if isinstance(rows, pa.Table) else None
        self._rows: list[Any] | None = None if self._table is not None else list(rows)

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


class RowFilter(ABC):
    """Decides keep / drop for a batch of rows; subclasses are ~10 lines."""

    reason: str = "filtered"

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        self.config = config

    @abstractmethod
    def check(self, rows: Sequence[Row]) -> list[str | None]:
        """For each row: None to keep it, or a detail saying why it is dropped."""

    def verdicts(self, rows: Sequence[Row]) -> list[Verdict]:
        """`check` with this filter's reason attached (filters with several reasons override)."""
        return [None if d is None else (self.reason, d) for d in self.check(rows)]


@dataclass
class FilterOutcome:
    """Rows kept, rows rejected (with reason, detail and the row as JSON), and counts."""

    kept: Sequence[Row] = field(default_factory=list)  # a RowBatch when given one
    rejected: Sequence[dict[str, str]] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)

    @property
    def rejected_by_reason(self) -> dict[str, int]:
        """Counts of rejected rows per reason."""
        return {k: v for k, v in sorted(self.counts.items()) if k not in ("total", "kept")}


def run_filters(rows: Sequence[Any], filters: Sequence[RowFilter]) -> FilterOutcome:
    """Pass rows through `filters` in order; each filter sees only the rows still kept.

    Kept rows come back as they were given: a RowBatch as a RowBatch (an Arrow table
    stays one), any other sequence as a list.
    """
    out = FilterOutcome()
    out.counts["total"] = len(rows)
    rejected: list[dict[str, str]] = []
    if isinstance(rows, RowBatch) and rows.table is not None:
        alive = rows  # an Arrow table holds nothing but rows
    else:
        mappings = []
        for row in rows:  # anything that is not a mapping cannot be checked further
            if isinstance(row, Mapping):
                mappings.append(dict(row))
            else:
                _reject(rejected, out.counts, row,
                        ("schema", f"row is a {type(row).__name__}, expected a dict"))
        alive = RowBatch(mappings)
    for flt in filters:
        if not len(alive):
            break
        verdicts = flt.verdicts(alive)
        if len(verdicts) != len(alive):
            raise SchemaMismatchError(
                f"filter {type(flt).__name__} returned {len(verdicts)} verdicts for "
                f"{len(alive)} rows; it must return one per row."
            )
        dropped = [i for i, v in enumerate(verdicts) if v is not None]
        if dropped:
            for i, row in zip(dropped, alive.take(dropped), strict=True):
                _reject(rejected, out.counts, row, verdicts[i])
            alive = alive.take([i for i, v in enumerate(verdicts) if v is None])
    out.kept = alive if isinstance(rows, RowBatch) else alive.to_list()
    out.rejected = rejected
    out.counts["kept"] = len(alive)
    return out


def _reject(rejected: list[dict[str, str]], counts: Counter[str], row: Any,
            verdict: tuple[str, str]) -> None:
    reason, detail = verdict
    rejected.append({"reason": reason, "detail": _storable(detail), "row": row_to_json(row)})
    counts[reason] += 1


def row_to_json(row: Any) -> str:
    """A JSON text of any row, so junk is quarantined as it came (bytes, NaN and all)."""
    text = json.dumps(row, ensure_ascii=False, default=repr, allow_nan=True)
    # Lone surrogates (bytes decoded with surrogateescape) cannot be stored as UTF-8;
    # JSON's \u escapes keep them, as written.
    return text if _is_utf8(text) else json.dumps(row, default=repr, allow_nan=True)


def _storable(text: str) -> str:
    """`text`, with what cannot be written as UTF-8 escaped."""
    return text if _is_utf8(text) else text.encode("utf-8", "backslashreplace").decode()


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# ---- schema ---------------------------------------------------------------------------
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

    def check(self, rows: Sequence[Row]) -> list[str | None]:
        return [None if v is None else v[1] for v in self.verdicts(rows)]

    def verdicts(self, rows: Sequence[Row]) -> list[Verdict]:
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
            return conform(pa.Table.from_pylist(_stringify_truth(clean, self.schema)),
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
    if _is_list(src) and _is_list(dst):
        return _same_kind(src.value_type, dst.value_type)
    return False


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t)


def _is_null(arr: pa.Array) -> np.ndarray:
    return arr.is_null().to_numpy(zero_copy_only=False)


@lru_cache(maxsize=1)
def _whitespace() -> str:
    """Every character `str.strip()` removes, for the same test in Arrow."""
    return "".join(c for c in map(chr, range(0x110000)) if c.isspace())


def _blank(arr: pa.Array) -> np.ndarray:
    """Null, or nothing but whitespace (as `not value.strip()` tests it)."""
    length = pc.utf8_length(pc.utf8_trim(arr, characters=_whitespace()))
    return pc.equal(pc.fill_null(length, 0), 0).to_numpy(zero_copy_only=False)


def _prompt_suspects(arr: pa.Array) -> np.ndarray | None:
    """Prompts that are null or empty, or hold a null message or a blank role or content."""
    kind = arr.type
    if not _is_list(kind) or not pa.types.is_struct(kind.value_type):
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
    if _is_list(kind):
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


# ---- over-long prompts ------------------------------------------------------------------
class OverlongPromptFilter(RowFilter):
    """Drop prompts longer than max_prompt_length tokens, counted exactly as verl counts.

    verl: len(tokenizer.apply_chat_template(prompt, add_generation_prompt=True, **kwargs)).
    The same count in batches: render every prompt with the chat template, then tokenize
    the texts in one fast-tokenizer call (apply_chat_template tokenizes without special
    tokens, so we do too).
    """

    reason = "overlong_prompt"

    def __init__(self, tokenizer: Any, max_prompt_length: int, prompt_key: str = "prompt",
                 chat_template_kwargs: Mapping[str, Any] | None = None,
                 batch_size: int = 512) -> None:
        super().__init__(None)
        self.tokenizer = tokenizer
        self.max_prompt_length = max_prompt_length
        self.prompt_key = prompt_key
        # verl drops these from the user's kwargs too: the count needs token ids.
        self.kwargs = {k: v for k, v in (chat_template_kwargs or {}).items()
                       if k not in ("tokenize", "return_dict", "return_tensors")}
        self.batch_size = batch_size

    def lengths(self, prompts: Sequence[list[dict[str, str]]]) -> list[int]:
        """Token counts of chat prompts with the generation prompt appended."""
        out: list[int] = []
        for start in range(0, len(prompts), self.batch_size):
            batch = [list(p) for p in prompts[start : start + self.batch_size]]
            texts = self.tokenizer.apply_chat_template(
                batch, add_generation_prompt=True, tokenize=False, **self.kwargs)
            ids = self.tokenizer(list(texts), add_special_tokens=False)["input_ids"]
            out += [len(x) for x in ids]
        return out

    def check(self, rows: Sequence[Row]) -> list[str | None]:
        lengths = self.lengths(column_of(rows, self.prompt_key))
        return [None if n <= self.max_prompt_length
                else f"{n} tokens > max_prompt_length {self.max_prompt_length}"
                for n in lengths]


# ---- duplicates -----------------------------------------------------------------------
class DuplicateFilter(RowFilter):
    """Drop prompts already in the dataset or earlier in the same batch (normalised)."""

    reason = "duplicate"

    def __init__(self, store: Store, dataset: str, version: int | None = None,
                 prompt_key: str = "prompt") -> None:
        super().__init__(None)
        self.store, self.dataset, self.version = store, dataset, version
        self.prompt_key = prompt_key

    def check(self, rows: Sequence[Row]) -> list[str | None]:
        keys = prompt_keys(column_of(rows, self.prompt_key))
        stored = self.store.contains_prompts(self.dataset, keys, self.version)
        seen: dict[int, int] = {}
        out: list[str | None] = []
        for i, (key, in_store) in enumerate(zip(keys.tolist(), stored.tolist(), strict=True)):
            if in_store:
                out.append(f"prompt already in dataset {self.dataset!r}")
            elif key in seen:
                out.append(f"same prompt as generated row {seen[key]} of this round")
            else:
                seen[key] = i
                out.append(None)
        return out

