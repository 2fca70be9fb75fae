"""Stage 1: load the head version of a dataset (memory-mapped), its record, and the
batch ends of its inbox that no version covers yet, their rollouts read from the store."""

from __future__ import annotations

import datasets
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from dyngen.faults import crash_point
from dyngen.round import load_head
from dyngen.round.context import RoundBatchEnd
from dyngen.round.inbox import covers_text, describe, pending_batch_ends
from dyngen.round.rollouts import RolloutsPolicy
from dyngen.store import Store, VersionRecord
from dyngen.store.location import StoreSpec


@task(name="load", cache_policy=NO_CACHE)
def load_dataset(store_root: StoreSpec, dataset: str, rollouts: RolloutsPolicy | None = None,
                 ) -> tuple[datasets.Dataset, VersionRecord, tuple[RoundBatchEnd, ...]]:
    """The head version's rows (no copy of old rows), its version record, and the batch
    ends pending at it (their rollouts checked by `rollouts`, the round's policy)."""
    store = Store.from_config(store_root)
    data, record = load_head(store, dataset)
    pending = pending_batch_ends(store, dataset, record.version, rollouts or RolloutsPolicy())
    for entry in pending:
        if entry.rollouts_error:
            get_run_logger().warning("%s: the round covers it without its rollouts: %s",
                                     describe(entry.key), entry.rollouts_error)
    covered = f" ({covers_text([entry.key for entry in pending])})" if pending else ""
    get_run_logger().info("load: %s v%d, %d rows in; %d batch end(s) pending%s", dataset,
                          record.version, record.rows, len(pending), covered)
    crash_point("round.after_load")
    return data, record, pending
