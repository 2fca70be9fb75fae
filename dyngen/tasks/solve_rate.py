"""The solve-rate filter's grading, one grade task per partition of the round.

Each partition grades its own share of the rows the other filters kept, on the round's task
runner (a thread each, or a Ray task on the cluster that asked the partition's generator),
with the round's retries for a policy that was unreachable or overloaded. Every share must
come back: one failing for good fails the round before anything is written.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig
from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.futures import wait
from prefect.tasks import exponential_backoff

from dyngen.filters.solve_rate import grade_share, settings_of, split
from dyngen.round import RoundContext
from dyngen.round.task_runners import build_task_runner, partition_resources
from dyngen.rows import RowBatch
from dyngen.tasks.direct import direct
from dyngen.tasks.generate import can_pass


@task(name="solve-rate", cache_policy=NO_CACHE)
def grade_rows_task(settings: dict[str, Any], prompt_key: str, rows: RowBatch,
                    salt: list[Any]) -> dict[str, Any]:
    """One share's grades and what asking the policy cost."""
    return grade_share(settings, prompt_key, rows, tuple(salt))


def share_grader(cfg: DictConfig, context: RoundContext
                 ) -> Callable[[RowBatch], list[dict[str, Any]]]:
    """Grade rows as the round's partitions: each share a task, in partition order."""
    settings, key = settings_of(cfg), cfg.data.prompt_key
    count, runner_cfg = int(cfg.round.partitions), cfg.round.task_runner
    retries, delay = int(cfg.round.retries), float(cfg.round.retry_delay_seconds)
    graded = grade_rows_task.with_options(
        retries=retries, retry_condition_fn=can_pass,
        retry_delay_seconds=exponential_backoff(delay) if retries and delay > 0 else 0,
        timeout_seconds=float(cfg.round.timeout_seconds))
    salt = [context.dataset, context.round]

    def grade(rows: RowBatch) -> list[dict[str, Any]]:
        shares = split(rows, count)
        if direct():  # a dry run: each share's grade in turn, in this thread
            return [graded.fn(settings, key, share, salt) for share in shares]
        if count == 1 and runner_cfg.kind == "threads":
            return [graded(settings, key, shares[0], salt)]
        with build_task_runner(runner_cfg, count) as runner, partition_resources(runner_cfg):
            futures = [runner.submit(graded.with_options(
                task_run_name=f"solve-rate-{i}-of-{count}"),
                {"settings": settings, "prompt_key": key, "rows": share, "salt": salt})
                for i, share in enumerate(shares)]
            wait(futures)
            return [future.result() for future in futures]  # the first failure raises

    return grade
