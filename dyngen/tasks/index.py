"""Maintenance: index the shards whose near-duplicate or semantic sidecar is missing or was
made otherwise."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from dyngen.store import Store
from dyngen.store.embeddings import VectorSettings
from dyngen.store.index import rebuild_index
from dyngen.store.location import StoreSpec
from dyngen.store.minhash import LshParams
from dyngen.store.semantic import VecKind


@task(name="rebuild-index", cache_policy=NO_CACHE)
def rebuild_index_of(store_root: StoreSpec, dataset: str,
                     params: LshParams | VectorSettings) -> int:
    """How many shards of the loadable versions were indexed (`dyngen rebuild-index`): their
    MinHash sidecars, or their semantic ones for VectorSettings."""
    kind = VecKind(params) if isinstance(params, VectorSettings) else params
    return rebuild_index(Store.from_config(store_root), dataset, kind)
