"""After the version stage: compact the head's small shards if the store's policy asks."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from dyngen.store import CompactionPolicy, Store
from dyngen.store.location import StoreSpec


@task(name="compact", cache_policy=NO_CACHE)
def compact_head(store_root: StoreSpec, dataset: str, policy: CompactionPolicy) -> list[int]:
    """The `compact` versions committed (none when the head has few small shards)."""
    return [rec.version for rec in Store.from_config(store_root).compact(dataset, policy)]
