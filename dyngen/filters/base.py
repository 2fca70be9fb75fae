"""The filter contract and its runner: each filter answers keep or drop, with a reason.

A filter answers, for each row, keep (None) or drop with a detail, as in datatrove; a
filter with several reasons answers (reason, detail). The runner owns the loop and the
bookkeeping: rejected rows are kept with their reason (never silently lost) and counted
per reason and per filter.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dyngen.errors import FilterError
from dyngen.rows import Row, RowBatch

Verdict = tuple[str, str] | None  # None keeps the row; (reason, detail) drops it
# What `check` may answer per row: None keeps it; a detail drops it for the filter's
# `reason`; (reason, detail) drops it for that reason.
Answer = str | tuple[str, str] | None


class RowFilter(ABC):
    """Decides keep / drop for a batch of rows; subclasses are ~10 lines.

    Built from its `round.filters` entry (path, name and the filter's own keys) as
    `config`. `stats` counts what this filter saw, kept and dropped per reason.
    """

    reason: str = "filtered"
    # Where the round's lineage keeps what `lineage()` returns (None: nothing beyond counts).
    lineage_key: str | None = None

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        self.config = config
        self.stats: Counter[str] = Counter()

    @abstractmethod
    def check(self, rows: Sequence[Row]) -> Sequence[Answer]:
        """For each row: None to keep it, or a detail (or (reason, detail)) saying why not."""

    def verdicts(self, rows: Sequence[Row]) -> list[Verdict]:
        """One (reason, detail) or None per row: `check`'s answers, checked and counted."""
        answers = list(self.check(rows))
        if len(answers) != len(rows):
            raise FilterError(
                f"filter {type(self).__name__} returned {len(answers)} verdicts for "
                f"{len(rows)} rows; expected one per row (None keeps a row, a detail drops it)."
            )
        verdicts = [self._verdict(answer) for answer in answers]
        self.stats["seen"] += len(rows)
        for verdict in verdicts:
            self.stats["kept" if verdict is None else f"dropped_{verdict[0]}"] += 1
        return verdicts

    def lineage(self) -> dict[str, Any] | None:
        """What the round's lineage keeps of this filter under `lineage_key` (what it asked,
        what that cost), once the chain has run; None for nothing."""
        return None

    def memo(self) -> Any:
        """What this filter learned of the round's rows that it need not learn again when
        the round asks the generator for more (round.top_up) and runs the chain over every
        row it has so far; None: nothing (most filters are cheap to run again)."""
        return None

    def recall(self, memo: Any) -> None:  # noqa: B027  (most filters keep nothing)
        """Take back what `memo()` returned in this round's earlier pass."""

    def finish(self, kept: RowBatch) -> RowBatch:
        """What the round stores of the rows every filter kept (the schema filter conforms
        them to the dataset's schema); most filters leave them as they are."""
        return kept

    def _verdict(self, answer: Any) -> Verdict:
        if answer is None:
            return None
        if isinstance(answer, str):
            return (self.reason, answer)
        if isinstance(answer, tuple) and len(answer) == 2 \
                and all(isinstance(part, str) for part in answer):
            return (answer[0], answer[1])
        raise FilterError(
            f"filter {type(self).__name__} answered {answer!r} for a row; expected None to "
            "keep it, a detail string, or a (reason, detail) pair of strings to drop it.")


@dataclass
class FilterOutcome:
    """Rows kept, rows rejected (with reason, detail and the row as JSON), and counts."""

    kept: Sequence[Row] = field(default_factory=list)  # a RowBatch when given one
    rejected: Sequence[dict[str, str]] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    # Per filter class: rows seen, kept and dropped_<reason>.
    by_filter: dict[str, dict[str, int]] = field(default_factory=dict)
    # Per filter's lineage_key: what the filter's `lineage()` recorded.
    records: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Per filter's lineage_key: what its `memo()` kept for a later pass of the same round.
    memos: dict[str, Any] = field(default_factory=dict)

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
    # What the generator refused comes first, counted by its reasons like any rejection.
    rejected: list[dict[str, str]] = list(getattr(rows, "quarantined", ()))
    out.counts.update(r["reason"] for r in rejected)
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
        out.by_filter[type(flt).__name__] = dict(flt.stats)
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
    rejected.append(rejection(row, verdict))
    counts[verdict[0]] += 1


def rejection(row: Any, verdict: tuple[str, str]) -> dict[str, str]:
    """A quarantined row as the store keeps it: its reason, its detail, the row as JSON."""
    reason, detail = verdict
    return {"reason": reason, "detail": _storable(detail), "row": row_to_json(row)}


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
