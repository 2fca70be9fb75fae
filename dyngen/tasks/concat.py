"""Stage 4: the kept rows become one immutable shard on top of the parent's shards."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from dyngen.faults import crash_point
from dyngen.filters import FilterOutcome
from dyngen.round import RoundContext, write_round
from dyngen.store import PendingCommit, Store
from dyngen.store.embeddings import VectorSettings
from dyngen.store.location import StoreSpec
from dyngen.store.minhash import LshParams
from dyngen.store.semantic import VecKind


@task(name="concat", cache_policy=NO_CACHE)
def concat_rows(store_root: StoreSpec, context: RoundContext, outcome: FilterOutcome,
                generator: str, lineage: dict[str, Any],
                index: LshParams | None = None,
                vectors: VectorSettings | None = None) -> PendingCommit:
    """Write the new shard and the quarantine shard; nothing is visible until committed.
    `index` hashes its near-duplicate sidecar, `vectors` embeds its semantic one (None: none).

    The stage's own time joins the lineage's timings before the record is written.
    """
    start = time.perf_counter()
    pending = write_round(Store.from_config(store_root), context, outcome, generator, lineage,
                          index, None if vectors is None else VecKind(vectors))
    timings = {**pending.lineage.get("timings", {}),
               "concat": round(time.perf_counter() - start, 3)}
    pending = replace(pending, lineage={**pending.lineage, "timings": timings})
    get_run_logger().info(
        "concat: %d kept rows in, %d rows out in %d new shard(s), %d rejected rows "
        "quarantined; none visible until committed", len(outcome.kept),
        sum(s.rows for s in pending.new_shards), len(pending.new_shards),
        sum(s.rows for s in pending.rejected))
    crash_point("round.after_concat")
    return pending
