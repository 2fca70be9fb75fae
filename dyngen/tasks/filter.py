"""Stage 3: schema → over-long prompt → duplicate → user filters, each rejection kept."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig
from prefect import task
from prefect.cache_policies import NO_CACHE

from dyngen.faults import crash_point
from dyngen.filters import FilterOutcome
from dyngen.filters.chain import build_filters, filter_rows
from dyngen.store import Store, VersionRecord


@task(name="filter", cache_policy=NO_CACHE)
def filter_generated(cfg: DictConfig, parent: VersionRecord, rows: list[Any]) -> FilterOutcome:
    """Rows kept and rows quarantined with their reasons, against the parent version."""
    store = Store.from_config(cfg.store)
    outcome = filter_rows(rows, build_filters(cfg, store, parent.dataset, parent, rows))
    crash_point("round.after_filter")
    return outcome
