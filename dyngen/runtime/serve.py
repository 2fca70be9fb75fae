"""Serve the generation round with its event trigger from one process (`dyngen serve`).

The same deployment as in prefect.yaml, for users without a work pool: a batch-end
event for a dataset becomes a run of `generation_round` with the event's trigger; one
round runs at a time and later ones wait their turn (ENQUEUE).

Two ways to run each round, both a process of its own:
- "fork" (default): a child forked from a warm process that imported the round once
  (runtime/warm_runner.py); a round starts in tens of milliseconds.
- "process": Prefect's runner (`prefect.serve`), a fresh interpreter per round, which
  imports everything again (1.5-2 s), and so picks up code changed since serving began.

Either way, a batch end the server stored and made no run of (its trigger service was
killed in between) is given its run (runtime/lost_runs.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any
from uuid import UUID

from omegaconf import DictConfig
from prefect import serve
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy
from prefect.deployments.runner import RunnerDeployment
from prefect.events import DeploymentEventTrigger
from prefect.exceptions import ObjectNotFound
from prefect.types.entrypoint import EntrypointType

from dyngen.config import load_config
from dyngen.config.generator_choice import require_generator
from dyngen.config.secrets import refuse_secrets
from dyngen.errors import ConfigError
from dyngen.flows.generation_round import generation_round
from dyngen.runtime.lost_runs import SERVER_ERRORS, LostRuns
from dyngen.runtime.warm_runner import WarmRunner
from dyngen.store.location import store_settings
from dyngen.store.names import validate_name
from dyngen.trainers.events import (
    DATASET_LABEL,
    EVENT_NAME,
    RESOURCE_PREFIX,
    resource_id,
    trigger_name,
)

DEPLOYMENT_NAME = "on-batch-end"
POLL_SECONDS = 0.2
ROUND_MARGIN_SECONDS = 300.0

# Templates render missing fields as empty values rather than dropping the run: the flow
# then fails with a message saying what was missing, which an operator can see.
TRIGGER_PARAMETERS: dict[str, Any] = {
    "dataset": f"{{{{ event.resource.get('{DATASET_LABEL}', '') }}}}",
    # Rendered to JSON text at run time, then parsed: the flow gets the payload's mapping.
    "trigger": {"__prefect_kind": "json", "value": {
        "__prefect_kind": "jinja", "template": "{{ event.payload.get('trigger', {}) | tojson }}"}},
}


def batch_end_trigger(dataset: str | None = None, config: dict[str, Any] | None = None,
                      threshold: int = 1) -> DeploymentEventTrigger:
    """Fire on `dyngen.batch.ended` for one dataset (or all), every `threshold` events."""
    match = {"prefect.resource.id": resource_id(validate_name(dataset)) if dataset
             else f"{RESOURCE_PREFIX}*"}
    return DeploymentEventTrigger(
        name=trigger_name(dataset),
        expect={EVENT_NAME}, match=match, threshold=threshold,
        # Counting N batch ends needs a window; a day covers any sane batch interval.
        within=timedelta(days=1) if threshold > 1 else timedelta(0),
        parameters={**TRIGGER_PARAMETERS, "config": config or {}},
    )


def round_deployment(dataset: str | None = None, config: dict[str, Any] | None = None,
                     every_n_batches: int = 1) -> RunnerDeployment:
    """The event-triggered deployment of generation_round, one run at a time."""
    refuse_secrets(config, "a deployment's parameters")
    return generation_round.to_deployment(
        name=DEPLOYMENT_NAME,
        # By module (`dyngen.flows.generation_round.generation_round`), not by file: a run
        # imports the installed dyngen whatever folder it starts in.
        entrypoint_type=EntrypointType.MODULE_PATH,
        triggers=[batch_end_trigger(dataset, config, every_n_batches)],
        concurrency_limit=ConcurrencyLimitConfig(
            limit=1, collision_strategy=ConcurrencyLimitStrategy.ENQUEUE),
        parameters={"config": config or {}},
        tags=["dyngen"] + ([f"dataset:{dataset}"] if dataset else []),
        description="A dyngen generation round, triggered by training batch-end events.",
    )


def serve_rounds(dataset: str | None = None, config: dict[str, Any] | None = None,
                 every_n_batches: int = 1, isolation: str = "fork",
                 poll_seconds: float = POLL_SECONDS,
                 max_round_seconds: float | None = None) -> None:
    """Serve the deployment until interrupted (Ctrl-C / SIGTERM)."""
    check_isolation(isolation)
    _once_reachable(refuse_to_replace_pool_deployment)
    require_generator(config, what="dyngen serve's config")
    deployment = round_deployment(dataset, config, every_n_batches)
    cfg = load_config(base=config)

    def lost_runs(deployment_id: UUID) -> LostRuns:
        return LostRuns(deployment_id, dataset, config or {}, store_settings(cfg.store),
                        every_n_batches)

    if isolation == "process":
        # Not paused on shutdown: events that arrive while nothing serves become scheduled
        # runs that wait for the next `dyngen serve`, instead of being refused.
        with _looking_for_lost_runs(lost_runs):
            serve(deployment, print_starting_message=True, pause_on_shutdown=False,
                  query_seconds=poll_seconds)
        return
    if max_round_seconds is None:
        # Every generate attempt may use its whole timeout; the rest of a round is quick.
        max_round_seconds = (int(cfg.round.retries) + 1) * float(cfg.round.timeout_seconds) \
            + ROUND_MARGIN_SECONDS
    WarmRunner(generation_round, deployment, poll_seconds, max_round_seconds,
               preload=_generator_module(cfg), lost_runs=lost_runs).serve()


@contextmanager
def _looking_for_lost_runs(lost_runs: Callable[[UUID], LostRuns]) -> Iterator[None]:
    """Beside Prefect's runner, a thread making the runs of batch ends whose trigger was
    lost (runtime/lost_runs.py), once the deployment is on the server."""
    stopping = threading.Event()

    def look() -> None:
        name = f"{generation_round.name}/{DEPLOYMENT_NAME}"
        with get_client(sync_client=True) as client:
            while not stopping.wait(1.0):
                try:
                    deployment_id = client.read_deployment_by_name(name).id
                    break
                except (ObjectNotFound, *SERVER_ERRORS):
                    continue
            else:
                return
            lost_runs(deployment_id).watch(client, stopping)

    thread = threading.Thread(target=look, name="dyngen-lost-runs", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stopping.set()


def _once_reachable(call: Any) -> None:
    """`call()`, waiting for a Prefect server that is down (`dyngen serve` restarted during
    an outage goes on once the server is back, as it does through one while it serves)."""
    import time

    import httpx
    from prefect.exceptions import PrefectHTTPStatusError

    said = False
    while True:
        try:
            return call()
        except (httpx.HTTPError, PrefectHTTPStatusError, OSError) as exc:
            if isinstance(exc, PrefectHTTPStatusError) and exc.response.status_code < 500:
                raise
            if not said:
                print(f"dyngen: the Prefect server is unreachable ({exc}); waiting for it",
                      flush=True)
                said = True
            time.sleep(1.0)


def check_isolation(isolation: str) -> None:
    """Fail unless `isolation` is one `dyngen serve` knows."""
    if isolation not in ("fork", "process"):
        raise ConfigError(f"--isolation must be 'fork' or 'process', found {isolation!r}.")


def refuse_to_replace_pool_deployment() -> None:
    """Serving applies the deployment `generation-round/on-batch-end` as its own; refuse when
    that name belongs to `prefect deploy`'s work-pool deployment, whose runs would then start
    with serve's settings on the pool's workers and fail there."""
    name = f"{generation_round.name}/{DEPLOYMENT_NAME}"
    with get_client(sync_client=True) as client:
        try:
            found = client.read_deployment_by_name(name)
        except ObjectNotFound:
            return
    if found.work_pool_name:
        raise ConfigError(
            f"the Prefect server already has deployment {name!r} on work pool "
            f"{found.work_pool_name!r} (from `prefect deploy`); `dyngen serve` would replace "
            "it with its own. Either run workers for that pool (`prefect worker start --pool "
            f"{found.work_pool_name}`) instead of serving, or delete it first (`prefect "
            f"deployment delete {name}`).")


def _generator_module(cfg: DictConfig) -> tuple[str, ...]:
    """The configured generator's module, when it is a package module (`pkg://...`)."""
    path = str(cfg.data.datagen.path)
    return (path.removeprefix("pkg://"),) if path.startswith("pkg://") else ()
