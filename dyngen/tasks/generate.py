"""Stage 2: build the configured generator and ask it for new rows (retried, timed out)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import datasets
from omegaconf import DictConfig
from prefect import Task, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import TaskRun
from prefect.states import State
from prefect.tasks import exponential_backoff

from dyngen.errors import CommitConflictError, DyngenError, ModelUnavailableError
from dyngen.generators import build_generator
from dyngen.round import (
    RoundContext,
    call_generator,
    class_path,
    generator_lineage,
    previous_generator_state,
)
from dyngen.store import Store
from dyngen.store.location import StoreSpec


@task(name="generate", cache_policy=NO_CACHE)
def generate_rows(datagen: DictConfig, dataset: datasets.Dataset | None, context: RoundContext,
                  store_root: StoreSpec) -> tuple[list[Any], dict[str, Any]]:
    """New rows from a freshly built generator, and which generator made them.

    Without `dataset` (a partition on another process or host), the parent version is
    memory-mapped from the store here rather than shipped.
    """
    store = Store.from_config(store_root)
    if dataset is None:
        dataset = store.load(context.dataset, context.parent)
    generator = build_generator(datagen)
    previous = previous_generator_state(store, context.dataset, class_path(generator),
                                        context.parent, context.partition, context.partitions)
    rows = call_generator(generator, dataset, replace(context, previous_state=previous))
    refused = len(getattr(rows, "quarantined", ()))
    part = f" (partition {context.partition} of {context.partitions})" \
        if context.partitions > 1 else ""
    get_run_logger().info("generate: %s made %d new rows from %d rows in%s%s",
                          type(generator).__name__, len(rows), len(dataset),
                          f", refused {refused}" if refused else "", part)
    return rows, generator_lineage(datagen, generator)


def can_pass(task: Task, task_run: TaskRun, state: State) -> bool:
    """Whether a failed generate run is worth retrying: not for an error that cannot pass.

    dyngen's own errors (config, trigger, rollouts, generator output, store damage, a model
    that refuses the requests) fail the same way every time, bar a commit conflict and a
    served model that was unreachable, down or overloaded; a generator's own exception or a
    timeout may not.
    """
    exc = state.result(raise_on_failure=False)
    return not isinstance(exc, DyngenError) or isinstance(
        exc, CommitConflictError | ModelUnavailableError)


def configured(cfg: DictConfig) -> Task:
    """`generate_rows` with the retries, backoff and timeout from `cfg.round`."""
    retries = int(cfg.round.retries)
    delay = float(cfg.round.retry_delay_seconds)
    return generate_rows.with_options(
        retries=retries,
        retry_delay_seconds=exponential_backoff(delay) if retries and delay > 0 else 0,
        timeout_seconds=float(cfg.round.timeout_seconds),
        retry_condition_fn=can_pass,
    )
