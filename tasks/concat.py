"""Stage 4: the kept rows become one immutable shard on top of the parent's shards."""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from dyngen.filters import FilterOutcome
from dyngen.round import RoundContext, write_round
from dyngen.store import PendingCommit, Store


@task(name="concat", cache_policy=NO_CACHE)
def concat_rows(store_root: str, context: RoundContext, outcome: FilterOutcome,
                generator: str, lineage: dict[str, Any]) -> PendingCommit:
    """Write the new shard and the quarantine shard; nothing is visible until committed."""
    return write_round(Store(store_root), context, outcome, generator, lineage)
