"""The generation round: load → generate → filter (→ solve rate) → concat → version, one flow
run each.

A round commits exactly one new dataset version, or nothing. A trigger (the batch-end
event) carries an idempotency key, so a retried or re-delivered round lands once. After
its version is committed and published, the round compacts the head's small shards if
the store's policy asks (`round.compaction`); that never fails a committed round.

A run is named `<dataset>-step-<N>` while it waits for its dataset's slot, and
`<dataset>-v<version>` once it knows the version it makes. Prefect records its parameters
with any credential in `store.storage_options` redacted (dyngen.config.secrets); a run of a
deployment, whose parameters Prefect keeps as given, is refused if they hold one, and fails
at once if they name no generator (dyngen.config.generator_choice).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from prefect import get_run_logger
from prefect.runtime import flow_run

from dyngen.config.generator_choice import require_generator
from dyngen.config.preflight import check_before_start
from dyngen.config.secrets import refuse_secrets
from dyngen.faults import crash_point
from dyngen.filters.chain import index_params
from dyngen.flows.redaction import deployment_run, redacting_flow
from dyngen.flows.round_guard import name_run, round_guard, waiting_run_name
from dyngen.flows.step_order import keep_step_order
from dyngen.round import committed_for, compaction_policy, round_inputs
from dyngen.round.context import RoundContext
from dyngen.round.lineage import log_line, round_lineage
from dyngen.store import Store, VersionRecord
from dyngen.store.location import store_settings
from dyngen.tasks.compact import compact_head
from dyngen.tasks.concat import concat_rows
from dyngen.tasks.filter import filter_generated
from dyngen.tasks.load import load_dataset
from dyngen.tasks.partitions import generate_all
from dyngen.tasks.solve_rate import solve_rate_stage
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
    with _stage("check"):  # everything the config names, before any work
        cfg, trig, rollouts = round_inputs(dataset, config, trigger, overrides or ())
        if deployment_run():
            refuse_secrets(cfg, "this deployment's parameters")
            # A deployment names its generator: it never runs the mock unasked.
            require_generator(config, overrides or (), what="this deployment's parameters")
        check_before_start(cfg)
    timings: dict[str, float] = {}
    # Before the dataset's slot, which the earlier rounds it waits for need.
    order = keep_step_order(dataset, trig, float(cfg.round.order_wait_seconds))
    with round_guard(dataset):
        where = store_settings(cfg.store)  # the root and how to reach it
        store = Store.from_config(where)
        done = committed_for(store, dataset, trig)
        if done is not None:
            return _already_committed(done, store)
        with _timed(timings, "load"):
            data, parent = load_dataset(where, dataset)
        context = RoundContext(dataset, parent.version + 1, parent.version, trig,
                               rollouts_policy=rollouts)
        name_run(dataset, context.round)
        with _timed(timings, "generate"):
            rows, generator, fanned_out = generate_all(cfg, data, context)
        with _timed(timings, "filter"):
            outcome = filter_generated(cfg, parent, rows)
        solve_rate = None
        if cfg.round.solve_rate.enabled:  # the expensive stage, on what the filters kept
            with _timed(timings, "solve_rate"):
                outcome, solve_rate = solve_rate_stage(cfg, outcome, context)
        lineage = round_lineage(context, generator, len(rows), outcome, timings,
                                run_id=flow_run.id, run_name=flow_run.name,
                                partitions=fanned_out, solve_rate=solve_rate,
                                step_order=order.lineage())
        with _stage("concat"):
            pending = concat_rows(where, context, outcome, generator["name"],
                                  lineage.to_dict(), index_params(cfg))
        with _stage("version"):
            record = commit_version(where, pending)
    get_run_logger().info(log_line(record))
    _publish(record, store)
    crash_point("round.after_lineage")
    return summary(record, created=True, compacted=_compact(cfg, dataset))


def _already_committed(done: VersionRecord, store: Store) -> dict[str, Any]:
    """The round of this trigger committed `done` before: publish it if its run could not."""
    get_run_logger().info("trigger %s already committed as version %d; nothing to do",
                          done.idempotency_key, done.version)
    if done.version == store.head_version(done.dataset):
        # Its round may have been killed after committing, before publishing.
        _publish(done, store, unless_published=True)
    return summary(done, created=False)


def _compact(cfg: Any, dataset: str) -> list[int]:
    """Compact after the commit, outside the round's slot; a failure is only a warning."""
    if not cfg.round.compaction.enabled:
        return []
    try:
        return compact_head(store_settings(cfg.store), dataset, compaction_policy(cfg))
    except Exception as exc:  # the round's version is committed; compaction can wait
        get_run_logger().warning("compacting %s after the round failed (the round's version "
                                 "is committed): %s", dataset, exc)
        return []


def _publish(record: VersionRecord, store: Store, unless_published: bool = False) -> None:
    """The version's lineage as Prefect artifacts and asset; a failure is only a warning."""
    try:
        if unless_published and lineage_published(record):
            return
        publish_lineage(record, store.history(record.dataset, newest=HISTORY_ROWS))
    except Exception as exc:  # the version is committed; its record is the source of truth
        get_run_logger().warning("version %d is committed, but publishing its lineage to "
                                 "Prefect failed: %s", record.version, exc)


def summary(record: Any, created: bool, compacted: list[int] | None = None) -> dict[str, Any]:
    """What the round did, as plain data (the flow run's result)."""
    return {"dataset": record.dataset, "version": record.version, "parent": record.parent,
            "rows": record.rows, "created": created,
            "counts": record.lineage.get("counts", {}), "compacted": compacted or []}


@contextmanager
def _timed(timings: dict[str, float], stage: str) -> Iterator[None]:
    """Record how long the block took, in seconds, as `timings[stage]`."""
    start = time.perf_counter()
    try:
        with _stage(stage):
            yield
    finally:
        timings[stage] = round(time.perf_counter() - start, 3)


@contextmanager
def _stage(stage: str) -> Iterator[None]:
    """Mark an exception escaping the block with the stage it came from (the CLI names it)."""
    try:
        yield
    except Exception as exc:
        if getattr(exc, "dyngen_stage", None) is None:
            with suppress(AttributeError):  # an exception type that takes no attributes
                exc.dyngen_stage = stage  # type: ignore[attr-defined]
        raise
