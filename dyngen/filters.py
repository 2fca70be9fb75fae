"""Row filters for generated rows: schema → over-long prompt → duplicate → user filters.

A filter answers, for each row, keep (None) or drop with a reason and a detail, as in
datatrove. The runner owns the loop and the bookkeeping: rejected rows are kept with
their reason (never silently lost) and counted per reason.

Rows a generator returns as a `datasets.Dataset` stay an Arrow table (a `RowBatch`), one
opaque value for Prefect; the schema filter (`dyngen.schema_filter`) reads it by column.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import pyarrow as pa

from dyngen.errors import SchemaMismatchError
from dyngen.store import Store
from dyngen.store.keys import prompt_keys

Row = dict[str, Any]
Verdict = tuple[str, str] | None  # None keeps the row; (reason, detail) drops it



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

