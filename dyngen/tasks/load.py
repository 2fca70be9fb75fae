"""Stage 1: load the head version of a dataset (memory-mapped) and its record."""

from __future__ import annotations

import datasets
from prefect import task
from prefect.cache_policies import NO_CACHE

from dyngen.faults import crash_point
from dyngen.round import load_head
from dyngen.store import Store, VersionRecord
from dyngen.store.location import StoreSpec


@task(name="load", cache_policy=NO_CACHE)
def load_dataset(store_root: StoreSpec, dataset: str) -> tuple[datasets.Dataset, VersionRecord]:
    """The head version's rows (no copy of old rows) and its version record."""
    loaded = load_head(Store.from_config(store_root), dataset)
    crash_point("round.after_load")
    return loaded
