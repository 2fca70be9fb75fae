"""Row filters for generated rows: schema → over-long prompt → duplicate → near-duplicate →
(when round.semantic_duplicate is on) semantic duplicate → user filters → (when
round.solve_rate is on) the policy's solve rate.

`base` holds the contract (`RowFilter`: `check` answers keep or drop per row) and its
runner; one module per built-in filter; `chain` builds the round's filters from the
config. A user filter derives from `RowFilter` and is named in `round.filters`.
"""

from dyngen.filters.base import (
    Answer,
    FilterOutcome,
    RowFilter,
    Verdict,
    row_to_json,
    run_filters,
)
from dyngen.filters.duplicate import DuplicateFilter
from dyngen.filters.near_duplicate import NearDuplicateFilter
from dyngen.filters.overlong import OverlongPromptFilter
from dyngen.filters.schema import SchemaFilter
from dyngen.filters.semantic_duplicate import SemanticDuplicateFilter
from dyngen.filters.solve_rate import SolveRateFilter
from dyngen.rows import Row, RowBatch, column_of

__all__ = [
    "Answer",
    "DuplicateFilter",
    "FilterOutcome",
    "NearDuplicateFilter",
    "OverlongPromptFilter",
    "Row",
    "RowBatch",
    "RowFilter",
    "SchemaFilter",
    "SemanticDuplicateFilter",
    "SolveRateFilter",
    "Verdict",
    "column_of",
    "row_to_json",
    "run_filters",
]
