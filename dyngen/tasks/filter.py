"""Stage 3: schema → over-long prompt → duplicate → near-duplicate → user filters → solve
rate, each rejection kept with its reason."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from dyngen.faults import crash_point
from dyngen.filters import FilterOutcome
from dyngen.filters.chain import build_filters, filter_rows
from dyngen.round import RoundContext
from dyngen.store import Store, VersionRecord
from dyngen.tasks.solve_rate import share_grader


@task(name="filter", cache_policy=NO_CACHE)
def filter_generated(cfg: DictConfig, parent: VersionRecord, rows: list[Any],
                     context: RoundContext, earlier: FilterOutcome | None = None
                     ) -> FilterOutcome:
    """Rows kept and rows quarantined with their reasons, against the parent version; the
    solve-rate filter's rows are graded by the round's partitions. `earlier`: this round's
    outcome before it asked the generator again; what its filters learned is not paid
    for twice (RowFilter.memo)."""
    store = Store.from_config(cfg.store)
    filters = build_filters(cfg, store, parent.dataset, parent, rows,
                            grader=share_grader(cfg, context))
    for flt in filters if earlier is not None else ():
        if flt.lineage_key in earlier.memos:
            flt.recall(earlier.memos[flt.lineage_key])
    outcome = filter_rows(rows, filters)
    rejected = outcome.rejected_by_reason
    get_run_logger().info("filter: %d rows in, %d kept, %d rejected %s", len(rows),
                          len(outcome.kept), sum(rejected.values()), rejected)
    crash_point("round.after_filter")
    return outcome
