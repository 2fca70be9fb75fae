"""Keep a dataset's mirror (Delta Lake) at the head: one Delta commit per new version."""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from dyngen.mirror import mirror_dataset
from dyngen.store import Store
from dyngen.store.location import StoreSpec


@task(name="mirror", cache_policy=NO_CACHE)
def mirror_head(store_root: StoreSpec, dataset: str, mirror: dict[str, Any]) -> dict[str, Any]:
    """Where the mirror is, the version it holds now and how many versions this run added."""
    done = mirror_dataset(Store.from_config(store_root), dataset, mirror)
    return {"dest": done.dest, "version": done.version, "committed": len(done.committed),
            "deleted_files": done.deleted_files}
