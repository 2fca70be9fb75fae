"""The generation round: load → generate → filter → concat → version, one flow run each.

The flow reads as the round's diagram. Before its stages, `admitted` (dyngen.round.admission)
checks what the round is asked and answers whether the round's trigger already committed a
version: a retried or re-delivered round lands once. The round covers every batch end its
dataset's inbox holds that the head it loaded does not (dyngen.round.inbox): it ends at
once if a version covers its trigger's own (or, a catch-up round, if nothing is pending),
and commits nothing if another round covers them first. The filter
stage runs the whole chain, the expensive solve-rate filter last. A round that keeps fewer
rows than the trainer will draw before the next round asks its generator again, within
`round.top_up`'s budget, and filters every row so far together (dyngen.round.top_up).
After its version is committed and published, the round compacts the head's small shards
if the store's policy asks (`round.compaction`); that never fails a committed round.

In Prefect's graph each stage is fed by the one before it, and by nothing else: the other
values a stage takes are passed `quote`d (not tracked) and the previous stage's result
`opaque` (tracked, not searched for other runs' results inside). Each stage logs one line
of what it did: rows in, rows out, reasons.

A run is named `<dataset>-step-<N>` until it knows the version it makes, then
`<dataset>-v<version>` (dyngen.round.run_names).
Prefect records its parameters with any credential in `store.storage_options` redacted
(dyngen.round.redaction); a run of a deployment, whose parameters Prefect keeps as given,
is refused if they hold one, and fails at once if they name no generator.
"""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger
from prefect.utilities.annotations import opaque, quote

from dyngen.faults import crash_point
from dyngen.filters.chain import index_params, vector_params
from dyngen.round import compaction_policy
from dyngen.round.admission import admitted
from dyngen.round.lineage import log_line
from dyngen.round.redaction import redacting_flow
from dyngen.round.run_names import waiting_run_name
from dyngen.round.stages import stage, timed
from dyngen.round.top_up import TopUp
from dyngen.store import Store, VersionRecord
from dyngen.store.location import store_settings
from dyngen.tasks.compact import compact_head
from dyngen.tasks.concat import concat_rows
from dyngen.tasks.filter import filter_generated
from dyngen.tasks.load import load_dataset
from dyngen.tasks.partitions import generate_all
from dyngen.tasks.version import commit_version, lineage_published, publish_lineage

# The history artifact shows the newest versions (`dyngen log --all` shows all): a round
# reads only their records.
HISTORY_ROWS = 100


# The result is a summary of the version record, the durable truth: never persisted (and
# Prefect need not ask the server for its default result storage to decide that).
@redacting_flow(name="generation-round", flow_run_name=waiting_run_name, persist_result=False)
def generation_round(
    dataset: str,
    config: dict[str, Any] | None = None,
    trigger: dict[str, Any] | None = None,
    overrides: list[str] | None = None,
) -> dict[str, Any]:
    """Grow `dataset` by one version from the configured generator's new rows."""
    with admitted(dataset, config, trigger, overrides or ()) as rnd:
        if rnd.committed is not None:
            return _already_committed(rnd.committed, rnd.store)
        cfg, where, timings = rnd.cfg, rnd.where, rnd.timings
        while True:  # again only if a rival covered some of its batch ends, not its own
            with timed(timings, "load"):  # the head, and the batch ends it does not cover
                data, parent, batch_ends = load_dataset(where, dataset, rnd.rollouts)
            if (done := rnd.nothing_to_do(parent, batch_ends)) is not None:
                return _nothing_new(done, rnd.store)
            asked = TopUp.of(cfg, rnd.context(parent, batch_ends))  # again while short
            while (context := asked.next_context()) is not None:
                with timed(timings, "generate"):
                    rows = asked.add(*generate_all(cfg, data, context))
                with timed(timings, "filter"):  # every filter of the chain, the solve rate last
                    outcome = asked.filtered(filter_generated(
                        cfg, quote(parent), opaque(rows), quote(context), quote(asked.outcome)))
            lineage = rnd.lineage(asked)
            with stage("concat"):
                pending = concat_rows(where, quote(asked.context), opaque(outcome), asked.name,
                                      quote(lineage), index_params(cfg), vector_params(cfg))
            with stage("version"):  # or the version that covered its batch ends meanwhile
                record, created = commit_version(where, opaque(pending))
            if created:
                break
            if not rnd.again(record, batch_ends):
                return _nothing_new(record, rnd.store)
    get_run_logger().info(log_line(record))
    _publish(record, rnd.store)
    crash_point("round.after_lineage")
    return summary(record, created=True, compacted=_compact(cfg, dataset))


def _already_committed(done: VersionRecord, store: Store) -> dict[str, Any]:
    """The round of this trigger committed `done` before: publish it if its run could not."""
    step = (done.lineage.get("trigger") or {}).get("step")
    get_run_logger().info("trigger %s (step %s) already committed as version %d; nothing to do",
                          done.idempotency_key, step, done.version)
    return _nothing_new(done, store)


def _nothing_new(done: VersionRecord, store: Store) -> dict[str, Any]:
    """The summary of `done`, not made by this run; published if its run could not."""
    if done.version == store.head_version(done.dataset):
        # Its round may have been killed after committing, before publishing.
        _publish(done, store, unless_published=True)
    return summary(done, created=False)


def _compact(cfg: Any, dataset: str) -> list[int]:
    """Compact after the commit; a failure is only a warning."""
    if not cfg.round.compaction.enabled:
        return []
    try:
        return compact_head(store_settings(cfg.store), quote(dataset), compaction_policy(cfg))
    except Exception as exc:  # the round's version is committed; compaction can wait
        get_run_logger().warning("compacting %s after the round failed (the round's version "
                                 "is committed): %s", dataset, exc)
        return []


def _publish(record: VersionRecord, store: Store, unless_published: bool = False) -> None:
    """The version's lineage as Prefect artifacts and asset; a failure is only a warning."""
    try:
        if unless_published and lineage_published(record):
            return
        publish_lineage(opaque(record), quote(store.history(record.dataset, newest=HISTORY_ROWS)))
    except Exception as exc:  # the version is committed; its record is the source of truth
        get_run_logger().warning("version %d is committed, but publishing its lineage to "
                                 "Prefect failed: %s", record.version, exc)


def summary(record: Any, created: bool, compacted: list[int] | None = None) -> dict[str, Any]:
    """What the round did, as plain data (the flow run's result)."""
    return {"dataset": record.dataset, "version": record.version, "parent": record.parent,
            "rows": record.rows, "created": created, "idempotency_key": record.idempotency_key,
            "counts": record.lineage.get("counts", {}), "compacted": compacted or []}
