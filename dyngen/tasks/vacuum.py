"""Retention: expire old versions and delete data files no kept version names."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from dyngen.store import Store
from dyngen.store.location import StoreSpec


@task(name="vacuum", cache_policy=NO_CACHE)
def vacuum_dataset(store_root: StoreSpec, dataset: str, keep_versions: int | None,
                   keep_days: float | None, grace_seconds: float | None) -> dict[str, int]:
    """Versions below `expired_before` no longer load; `removed` files were deleted."""
    store = Store.from_config(store_root)
    result = store.vacuum(dataset, keep_versions=keep_versions, keep_days=keep_days,
                          grace_seconds=grace_seconds)
    return {"expired_before": result.expired_before, "removed": len(result.removed),
            "version": -1 if result.record is None else result.record.version}
