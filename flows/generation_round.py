"""The generation round: load → generate → filter → concat → version, one flow run each.

A round commits exactly one new dataset version, or nothing. A trigger (the batch-end
event) carries an idempotency key, so a retried or re-delivered round lands once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from prefect import flow, get_run_logger
from prefect.client.orchestration import get_client
from prefect.concurrency.sync import concurrency
from prefect.runtime import flow_run

from dyngen.config import load_config
from dyngen.round import RoundContext, Trigger
from dyngen.store import Store
from dyngen.store.names import validate_name
from tasks import generate
from tasks.concat import concat_rows
from tasks.filter import filter_generated
from tasks.load import load_dataset
from tasks.version import commit_version, publish_lineage

GUARD_TIMEOUT_SECONDS = 3600.0


def _run_name() -> str:
    params = flow_run.parameters
    step = (params.get("trigger") or {}).get("step") if isinstance(params.get("trigger"),
                                                                   Mapping) else None
    suffix = f"step-{step}" if isinstance(step, int) else "round"
    return f"{params.get('dataset', 'dataset')}-{suffix}"


@flow(name="generation-round", flow_run_name=_run_name)
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
    logger = get_run_logger()
    timings: dict[str, float] = {}
    with round_guard(dataset):
        _label_run(dataset, None)
        store = Store(cfg.store.root)
        key = trig.idempotency_key(dataset)
        done = store.find_idempotency_key(dataset, key) if key else None
        if done is not None:
            logger.info("trigger %s already committed as version %d; nothing to do", key,
                        done.version)
            return summary(done, created=False)

        with _timed(timings, "load"):
            data, parent = load_dataset(cfg.store.root, dataset)
        context = RoundContext(dataset, parent.version + 1, parent.version, trig)
        _label_run(dataset, context.round)
        with _timed(timings, "generate"):
            rows, generator = generate.configured(cfg)(cfg.data.datagen, data, context,
                                                       cfg.store.root)
        with _timed(timings, "filter"):
            outcome = filter_generated(cfg, parent, rows)
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
        }
        with _timed(timings, "concat"):
            pending = concat_rows(cfg.store.root, context, outcome, generator["name"], lineage)
        record = commit_version(cfg.store.root, pending)
    logger.info("%s: v%s → v%d, kept %d of %d, rejected %s", dataset, parent.version,
                record.version, len(outcome.kept), len(rows), outcome.rejected_by_reason)
    try:
        publish_lineage(record, store.history(dataset))
    except Exception as exc:  # the version is committed; its record is the source of truth
        logger.warning("version %d is committed, but publishing its lineage to Prefect "
                       "failed: %s", record.version, exc)
    return summary(record, created=True)


def summary(record: Any, created: bool) -> dict[str, Any]:
    """What the round did, as plain data (the flow run's result)."""
    return {"dataset": record.dataset, "version": record.version, "parent": record.parent,
            "rows": record.rows, "created": created,
            "counts": record.lineage.get("counts", {})}


@contextmanager
def round_guard(dataset: str) -> Iterator[None]:
    """One round per dataset at a time, across processes and machines (a Prefect limit)."""
    name = f"dyngen-round-{dataset}"
    with get_client(sync_client=True) as client:
        client.upsert_global_concurrency_limit_by_name(name, 1)
    with concurrency(name, occupy=1, strict=True, timeout_seconds=GUARD_TIMEOUT_SECONDS):
        yield


def _label_run(dataset: str, round_no: int | None) -> None:
    """Name the flow run after the dataset and round, and tag it with the dataset."""
    if flow_run.id is None:
        return
    name = f"{dataset}-v{round_no}" if round_no is not None else None
    with get_client(sync_client=True) as client:
        current = client.read_flow_run(flow_run.id)
        tags = sorted(set(current.tags) | {f"dataset:{dataset}", "dyngen"})
        client.update_flow_run(flow_run.id, name=name, tags=tags)


@contextmanager
def _timed(timings: dict[str, float], stage: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[stage] = round(time.perf_counter() - start, 3)
