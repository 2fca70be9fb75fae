"""Row filters for generated rows: schema → over-long prompt → duplicate → user filters.

A filter answers, for each row, keep (None) or drop with a reason and a detail, as in
datatrove. The runner owns the loop and the bookkeeping: rejected rows are kept with
their reason (never silently lost) and counted per reason.
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from dyngen.errors import SchemaMismatchError
from dyngen.store import PROVENANCE_COLUMNS, Store
from dyngen.store.keys import prompt_keys
from dyngen.store.shards import conform

Row = dict[str, Any]
Verdict = tuple[str, str] | None  # None keeps the row; (reason, detail) drops it


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

    kept: list[Row] = field(default_factory=list)
    rejected: list[dict[str, str]] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)

    @property
    def rejected_by_reason(self) -> dict[str, int]:
        """Counts of rejected rows per reason."""
        return {k: v for k, v in sorted(self.counts.items()) if k not in ("total", "kept")}


def run_filters(rows: Sequence[Any], filters: Sequence[RowFilter]) -> FilterOutcome:
    """Pass rows through `filters` in order; each filter sees only the rows still kept."""
    out = FilterOutcome()
    out.counts["total"] = len(rows)
    alive: list[Row] = []
    for row in rows:  # anything that is not a mapping cannot be checked further
        if isinstance(row, Mapping):
            alive.append(dict(row))
        else:
            _reject(out, row, ("schema", f"row is a {type(row).__name__}, expected a dict"))
    for flt in filters:
        if not alive:
            break
        verdicts = flt.verdicts(alive)
        if len(verdicts) != len(alive):
            raise SchemaMismatchError(
                f"filter {type(flt).__name__} returned {len(verdicts)} verdicts for "
                f"{len(alive)} rows; it must return one per row."
            )
        survivors = []
        for row, verdict in zip(alive, verdicts, strict=True):
            if verdict is None:
                survivors.append(row)
            else:
                _reject(out, row, verdict)
        alive = survivors
    out.kept = alive
    out.counts["kept"] = len(alive)
    return out


def _reject(out: FilterOutcome, row: Any, verdict: tuple[str, str]) -> None:
    reason, detail = verdict
    out.rejected.append({"reason": reason, "detail": detail, "row": row_to_json(row)})
    out.counts[reason] += 1


def row_to_json(row: Any) -> str:
    """A JSON text of any row, so junk is quarantined as it came (bytes, NaN and all)."""
    return json.dumps(row, ensure_ascii=False, default=repr, allow_nan=True)


# ---- schema ---------------------------------------------------------------------------
class SchemaFilter(RowFilter):
    """verl's row schema, then the dataset's own Arrow schema."""

    reason = "schema"

    def __init__(self, schema: pa.Schema, prompt_key: str = "prompt") -> None:
        super().__init__(None)
        self.schema = schema
        self.prompt_key = prompt_key

    def check(self, rows: Sequence[Row]) -> list[str | None]:
        details = [self._check_row(r) for r in rows]
        ok = [i for i, d in enumerate(details) if d is None]
        if ok and self._fits([rows[i] for i in ok]) is not None:
            # Some row does not fit the dataset's types: find which, one at a time.
            for i in ok:
                details[i] = self._fits([rows[i]])
        return details

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
        if truth is None or (isinstance(truth, float) and not math.isfinite(truth)):
            return f"reward_model.ground_truth must be a finite value, found {truth!r}"
        extra = row.get("extra_info")
        if extra is not None and not isinstance(extra, Mapping):
            return f"extra_info must be a dict, found {_kind(extra)}"
        return None

    def _fits(self, rows: list[Row]) -> str | None:
        clean = [{k: v for k, v in r.items() if k not in PROVENANCE_COLUMNS} for r in rows]
        try:
            conform(pa.Table.from_pylist(_stringify_truth(clean, self.schema)), self.schema)
        except (pa.ArrowException, SchemaMismatchError, TypeError, ValueError) as exc:
            return f"does not fit the dataset's schema: {exc}"
        return None


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
        if isinstance(truth, (int, float)) and not isinstance(truth, bool):
            r = {**r, "reward_model": {**r["reward_model"], "ground_truth": str(truth)}}
        out.append(r)
    return out


def normalise_row(row: Row, schema: pa.Schema) -> Row:
    """The stored form of a kept row (numeric ground truth as text when the dataset is)."""
    return _stringify_truth([row], schema)[0]


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
        lengths = self.lengths([r[self.prompt_key] for r in rows])
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
        keys = prompt_keys([r[self.prompt_key] for r in rows])
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

