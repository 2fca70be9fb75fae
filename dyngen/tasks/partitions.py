"""Stage 2, fanned out: one generate task per partition on the configured task runner.

Each partition is its own task run with the round's retries and timeout, so a failed
partition is retried alone. The round goes on only when every partition has its rows;
one partition failing for good fails the round before anything is written.
"""

from __future__ import annotations

from typing import Any

import datasets
from omegaconf import DictConfig
from prefect.futures import wait

from dyngen.faults import crash_point
from dyngen.round import RoundContext
from dyngen.round.partitions import (
    partition_contexts,
    partitions_lineage,
    union_generator_lineage,
    union_rows,
)
from dyngen.round.task_runners import build_task_runner, partition_resources
from dyngen.rows import RowBatch
from dyngen.store.location import store_settings
from dyngen.tasks.direct import call, direct
from dyngen.tasks.generate import configured


def generate_all(cfg: DictConfig, dataset: datasets.Dataset, context: RoundContext,
                 ) -> tuple[RowBatch, dict[str, Any], dict[str, Any] | None]:
    """The round's new rows, the generator's lineage, and the fan-out's (None if none).

    One partition on the default runner is the generate task called in the flow's own
    thread, as before partitions existed (its timeout can interrupt the generator there).
    """
    count, runner_cfg = int(cfg.round.partitions), cfg.round.task_runner
    task = configured(cfg)
    if count == 1 and (runner_cfg.kind == "threads" or direct()):
        rows, generator = call(task, cfg.data.datagen, dataset, context, store_settings(cfg.store))
        crash_point("round.after_generate")
        return rows, generator, None
    # Partitions load the parent version themselves: a Ray worker may be on another host.
    shared = {"datagen": cfg.data.datagen, "dataset": None, "store_root": store_settings(cfg.store)}
    if direct():  # a dry run: each partition's function in turn, in this thread
        results = [task.fn(**shared, context=p) for p in partition_contexts(context, count)]
    else:
        with build_task_runner(runner_cfg, count) as runner, partition_resources(runner_cfg):
            futures = [runner.submit(task.with_options(
                task_run_name=f"generate-{p.partition}-of-{count}"), {**shared, "context": p})
                for p in partition_contexts(context, count)]
            wait(futures)
            # In partition order; the first partition that failed after its retries raises.
            results = [future.result() for future in futures]
    batches = [rows for rows, _ in results]
    crash_point("round.after_generate")
    return (union_rows(batches), union_generator_lineage([gen for _, gen in results]),
            partitions_lineage(runner_cfg.kind, batches))
