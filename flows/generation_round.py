"""The generation round: load → generate → filter → concat → version, one flow run each.

A round commits exactly one new dataset version, or nothing. A trigger (the batch-end
event) carries an idempotency key, so a retried or re-delivered round lands once. After
its version is committed and published, the round compacts the head's small shards if
the store's policy asks (`round.compaction`); that never fails a committed round.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from prefect import flow, get_run_logger
from prefect.runtime import flow_run

from dyngen.config import load_config
from dyngen.faults import crash_point
from dyngen.rollouts import RolloutsPolicy
from dyngen.round import RoundContext, Trigger, compaction_policy
from dyngen.store import Store
from dyngen.store.location import store_settings
from dyngen.store.names import validate_name
from flows.round_guard import name_run, round_guard
from tasks.compact import compact_head
from tasks.concat import concat_rows
from tasks.filter import filter_generated
from tasks.load import load_dataset
from tasks.partitions import generate_all
from tasks.version import commit_version, lineage_published, publish_lineage

# The history artifact shows the newest versions (`dyngen log --all` shows all): a round
# reads only their records.
HISTORY_ROWS = 100


def _run_name() -> str:
    params = flow_run.parameters
    step = (params.get("trigger") or {}).get("step") if isinstance(params.get("trigger"),
                                                                   Mapping) else None
    suffix = f"step-{step}" if isinstance(step, int) else "round"
    return f"{params.get('dataset', 'dataset')}-{suffix}"


# The result is a summary of the version record, the durable truth: never persisted (and
# Prefect need not ask the server for its default result storage to decide that).
@flow(name="generation-round", flow_run_name=_run_name, persist_result=False)
def generation_round(
    dataset: str,
    config: dict[str, Any] | None = None,
    trigger: dict[str, Any] | None = None,
    overrides: list[str] | None = None,
) -> dict[str, Any]:
    """Grow `dataset` by one version from the configured generator's new rows."""
    validate_name(dataset)
    cfg = load_config(overrides=list(overrides or ()), base=config)
    trig = Trigger.parse(trigger)
    # Where a rollouts file may be comes from the deployment's config, never the event;
    # a path outside it (or a FIFO, or too large a file) fails here, before anything reads.
    rollouts = RolloutsPolicy.from_config(cfg)
    if trig.rollouts is not None:
        rollouts.check(trig.rollouts)
    logger = get_run_logger()
    timings: dict[str, float] = {}
    with round_guard(dataset):
        where = store_settings(cfg.store)  # the root and how to reach it
        store = Store.from_config(where)
        key = trig.idempotency_key(dataset)
        done = store.find_idempotency_key(dataset, key) if key else None
        if done is not None:
            logger.info("trigger %s already committed as version %d; nothing to do", key,
                        done.version)
            if done.version == store.head_version(dataset):
                # Its round may have been killed after committing, before publishing.
                _publish(done, store, logger, unless_published=True)
            return summary(done, created=False)

        with _timed(timings, "load"):
            data, parent = load_dataset(where, dataset)
        crash_point("round.after_load")
        context = RoundContext(dataset, parent.version + 1, parent.version, trig,
                               rollouts_policy=rollouts)
        name_run(dataset, context.round)
        with _timed(timings, "generate"):
            rows, generator, fanned_out = generate_all(cfg, data, context)
        crash_point("round.after_generate")
        with _timed(timings, "filter"):
            outcome = filter_generated(cfg, parent, rows)
        crash_point("round.after_filter")
        lineage = {
            "round": context.round,
            "generator": generator,
            "trigger": {"event_id": trig.event_id, "step": trig.step,
                        "metrics": trig.metrics, "rollouts": trig.rollouts},
            "counts": {"generated": len(rows), "kept": len(outcome.kept),
                       "rejected": outcome.rejected_by_reason},
            "flow_run_id": str(flow_run.id) if flow_run.id else None,
            "flow_run_name": flow_run.name,
            "timings": timings,
            **({"partitions": fanned_out} if fanned_out else {}),
        }
        with _timed(timings, "concat"):
            pending = concat_rows(where, context, outcome, generator["name"], lineage)
        crash_point("round.after_concat")
        record = commit_version(where, pending)
        crash_point("round.after_version")
    logger.info("%s: v%s → v%d, kept %d of %d, rejected %s", dataset, parent.version,
                record.version, len(outcome.kept), len(rows), outcome.rejected_by_reason)
    _publish(record, store, logger)
    crash_point("round.after_lineage")
    return summary(record, created=True, compacted=_compact(cfg, dataset, logger))


def _compact(cfg: Any, dataset: str, logger: Any) -> list[int]:
    """Compact after the commit, outside the round's slot; a failure is only a warning."""
    if not cfg.round.compaction.enabled:
        return []
    try:
        return compact_head(store_settings(cfg.store), dataset, compaction_policy(cfg))
    except Exception as exc:  # the round's version is committed; compaction can wait
        logger.warning("compacting %s after the round failed (the round's version is "
                       "committed): %s", dataset, exc)
        return []


def _publish(record: Any, store: Store, logger: Any, unless_published: bool = False) -> None:
    try:
        if unless_published and lineage_published(record):
            return
        publish_lineage(record, store.history(record.dataset, newest=HISTORY_ROWS))
    except Exception as exc:  # the version is committed; its record is the source of truth
        logger.warning("version %d is committed, but publishing its lineage to Prefect "
                       "failed: %s", record.version, exc)


def summary(record: Any, created: bool, compacted: list[int] | None = None) -> dict[str, Any]:
    """What the round did, as plain data (the flow run's result)."""
    return {"dataset": record.dataset, "version": record.version, "parent": record.parent,
            "rows": record.rows, "created": created,
            "counts": record.lineage.get("counts", {}), "compacted": compacted or []}


@contextmanager
def _timed(timings: dict[str, float], stage: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[stage] = round(time.perf_counter() - start, 3)
