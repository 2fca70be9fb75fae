"""The solve-rate stage over a round's kept rows: split into shares (one per partition),
each share graded on its own, the grades applied to the round's outcome as one filter."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from dyngen.filters.base import FilterOutcome, run_filters
from dyngen.filters.solve_rate.grading import Grade
from dyngen.filters.solve_rate.stage import SolveRateFilter
from dyngen.rows import RowBatch


def split(rows: RowBatch, count: int) -> list[RowBatch]:
    """`rows` as `count` contiguous shares of near-equal size (in partition order)."""
    n = len(rows)
    cuts = [n * i // count for i in range(count + 1)]
    return [rows.take(range(cuts[i], cuts[i + 1])) for i in range(count)]


def grade_share(settings: Mapping[str, Any], prompt_key: str, rows: RowBatch,
                salt: Any = ()) -> dict[str, Any]:
    """One share's grades and what asking cost: {grades, usage, model, n_in_one_request,
    seconds}. An empty share asks nothing."""
    started = time.perf_counter()
    flt = SolveRateFilter(settings, prompt_key, salt=salt)
    if not len(rows):
        return {"grades": [], "usage": {}, "model": None, "n_in_one_request": None,
                "seconds": 0.0}
    grades = flt.measure(rows)
    return {"grades": grades, "usage": flt.usage, "model": flt.model_name,
            "n_in_one_request": flt.n_in_one_request,
            "seconds": round(time.perf_counter() - started, 3)}


def apply_grades(outcome: FilterOutcome, grades: Sequence[Grade], settings: Mapping[str, Any],
                 model_name: str) -> FilterOutcome:
    """`outcome` with the rows outside the band moved to its quarantine, and the kept rows
    carrying their extra_info.solve_rate."""
    flt = SolveRateFilter(settings, grades=grades)
    flt.model_name = model_name
    kept = outcome.kept if isinstance(outcome.kept, RowBatch) else RowBatch(outcome.kept)
    graded = run_filters(kept, [flt])
    counts: Counter[str] = Counter(outcome.counts)
    counts.update({k: v for k, v in graded.counts.items() if k not in ("total", "kept")})
    kept = flt.finish(graded.kept if isinstance(graded.kept, RowBatch)
                      else RowBatch(graded.kept))
    counts["kept"] = len(kept)
    return FilterOutcome(kept=kept, rejected=RowBatch([*outcome.rejected, *graded.rejected]),
                         counts=counts,
                         by_filter={**outcome.by_filter, "SolveRateFilter": dict(flt.stats)})
