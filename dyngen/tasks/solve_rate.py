"""Stage 3b: the solve-rate stage on what the filters kept, one grade task per partition.

Each partition grades its own share of the kept rows on the round's task runner (a thread
each, or a Ray task on the cluster that asked the partition's generator), with the round's
retries for a policy that was unreachable or overloaded. Every share must come back: one
failing for good fails the round before anything is written.
"""

from __future__ import annotations

import time
from typing import Any

from omegaconf import DictConfig
from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.futures import wait
from prefect.tasks import exponential_backoff

from dyngen.filters import FilterOutcome
from dyngen.filters.solve_rate import (
    RewardChooser,
    apply_grades,
    grade_share,
    settings_of,
    split,
    stage_lineage,
)
from dyngen.round import RoundContext
from dyngen.round.task_runners import build_task_runner, partition_resources
from dyngen.rows import RowBatch
from dyngen.tasks.generate import can_pass


@task(name="solve-rate", cache_policy=NO_CACHE)
def grade_rows_task(settings: dict[str, Any], prompt_key: str, rows: RowBatch,
                    salt: list[Any]) -> dict[str, Any]:
    """One share's grades and what asking the policy cost."""
    return grade_share(settings, prompt_key, rows, tuple(salt))


def solve_rate_stage(cfg: DictConfig, outcome: FilterOutcome, context: RoundContext
                     ) -> tuple[FilterOutcome, dict[str, Any]]:
    """The outcome with the band applied, and the stage's lineage."""
    started = time.perf_counter()
    settings = settings_of(cfg)
    kept = outcome.kept if isinstance(outcome.kept, RowBatch) else RowBatch(outcome.kept)
    chooser = RewardChooser(settings["reward"]["path"], settings["reward"]["name"])
    rewards = chooser.check(kept.to_list())  # every data source graded, before any request
    count, runner_cfg = int(cfg.round.partitions), cfg.round.task_runner
    retries, delay = int(cfg.round.retries), float(cfg.round.retry_delay_seconds)
    graded = grade_rows_task.with_options(
        retries=retries, retry_condition_fn=can_pass,
        retry_delay_seconds=exponential_backoff(delay) if retries and delay > 0 else 0,
        timeout_seconds=float(cfg.round.timeout_seconds))
    key = cfg.data.prompt_key
    salt = [context.dataset, context.round]
    shares = split(kept, count)
    if count == 1 and runner_cfg.kind == "threads":
        results = [graded(settings, key, shares[0], salt)]
    else:
        with build_task_runner(runner_cfg, count) as runner, partition_resources(runner_cfg):
            futures = [runner.submit(graded.with_options(
                task_run_name=f"solve-rate-{i}-of-{count}"),
                {"settings": settings, "prompt_key": key, "rows": share, "salt": salt})
                for i, share in enumerate(shares)]
            wait(futures)
            results = [future.result() for future in futures]  # the first failure raises
    grades = [g for r in results for g in r["grades"]]
    model = next((r["model"] for r in results if r["model"]), settings.get("model_name") or "")
    lineage = stage_lineage(settings, grades, results, time.perf_counter() - started, rewards)
    lineage["share_seconds"] = [r["seconds"] for r in results]
    return apply_grades(outcome, grades, settings, str(model)), lineage
