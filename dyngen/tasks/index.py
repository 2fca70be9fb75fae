"""Maintenance: index the shards whose near-duplicate sidecar is missing or built otherwise."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from dyngen.store import Store
from dyngen.store.index import rebuild_index
from dyngen.store.location import StoreSpec
from dyngen.store.minhash import LshParams


@task(name="rebuild-index", cache_policy=NO_CACHE)
def rebuild_index_of(store_root: StoreSpec, dataset: str, params: LshParams) -> int:
    """How many shards of the loadable versions were indexed (`dyngen rebuild-index`)."""
    return rebuild_index(Store.from_config(store_root), dataset, params)
