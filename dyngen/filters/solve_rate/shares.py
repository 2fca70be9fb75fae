"""The solve-rate filter's rows split into shares (one per partition of the round), each
share graded on its own (dyngen.tasks.solve_rate runs each as a task)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

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
    policy_step, seconds}. An empty share asks nothing."""
    started = time.perf_counter()
    flt = SolveRateFilter(settings, prompt_key, salt=salt)
    if not len(rows):
        return {"grades": [], "usage": {}, "model": None, "n_in_one_request": None,
                "policy_step": None, "seconds": 0.0}
    grades = flt.measure(rows)
    return {"grades": grades, "usage": flt.usage, "model": flt.model_name,
            "n_in_one_request": flt.n_in_one_request, "policy_step": flt.policy_step,
            "seconds": round(time.perf_counter() - started, 3)}
