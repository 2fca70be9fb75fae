"""Serve the generation round from one process (`dyngen serve`): one serve per dataset.

The deployment is prefect.yaml's, for users without a work pool. A batch-end event for a
dataset wakes a run of `generation_round` with the event's trigger; serving one dataset,
an interval schedule (`--catch-up-seconds`, default 60) also runs a catch-up round
(trigger `{"catch_up": true}`), which covers whatever the store's inbox holds pending (a
batch end whose event never arrived too) and, with nothing pending, ends at once and
commits nothing. Serving every dataset there is no catch-up schedule: a catch-up round
names its dataset. One round runs at a time, later ones wait their turn (the deployment's
concurrency limit 1, ENQUEUE). Prefect records and wakes; the store decides what a round
covers, each batch end once.

One serve per dataset: serving holds the dataset's lease in the store (a serve of every
dataset, the store's), renewed while it serves (dyngen.runtime.serve_lease). Holding it, a
serve ends at start-up the runs a killed serve left unfinished (dyngen.runtime.served_runs).
Without PREFECT_API_URL, serve starts a `prefect server start` of its own (not Prefect's
temporary server, which runs no scheduler and so no catch-up round), its database in a
folder of its own, never `~/.prefect`'s, which another server may use; it says where and
stops it on the way out. A trainer that records its batch ends in the store needs nothing
more: the catch-up rounds cover them; pointed at it, its events wake rounds at once.

Two ways to run each round, both a process of its own:
- "fork" (default): a child forked from a warm process that imported the round once
  (runtime/warm_runner.py); a round starts in tens of milliseconds.
- "process": Prefect's runner (`prefect.serve`), a fresh interpreter per round, which
  imports everything again (1.5-2 s), and so picks up code changed since serving began.
"""

from __future__ import annotations

import _thread
import contextlib
import hashlib
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from omegaconf import DictConfig
from prefect import serve
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy
from prefect.deployments.runner import RunnerDeployment
from prefect.events import DeploymentEventTrigger
from prefect.exceptions import ObjectNotFound
from prefect.schedules import Interval, Schedule
from prefect.types.entrypoint import EntrypointType

from dyngen.config import load_config
from dyngen.config.generator_choice import require_generator
from dyngen.config.secrets import refuse_secrets
from dyngen.errors import ConfigError
from dyngen.flows.generation_round import generation_round
from dyngen.runtime.serve_lease import LeaseLostError, store_lease
from dyngen.runtime.served_runs import CATCH_UP_SLUG, end_left_runs, pause_catch_up
from dyngen.runtime.warm_runner import WarmRunner, drain_prefect_workers
from dyngen.store.location import store_settings
from dyngen.store.names import validate_name
from dyngen.trainers.events import (
    DATASET_LABEL,
    EVENT_NAME,
    RESOURCE_PREFIX,
    resource_id,
    trigger_name,
)

DEPLOYMENT_NAME = "on-batch-end"  # prefect.yaml's, and serve's of every dataset


def deployment_name(dataset: str | None) -> str:
    """The served deployment: `on-batch-end-<dataset>` serving one dataset, so serves of two
    datasets on one server keep their own trigger and schedule; `on-batch-end` serving
    every dataset."""
    return f"{DEPLOYMENT_NAME}-{validate_name(dataset)}" if dataset else DEPLOYMENT_NAME
POLL_SECONDS = 0.2
ROUND_MARGIN_SECONDS = 300.0
CATCH_UP_SECONDS = 60.0
CATCH_UP_TRIGGER: dict[str, Any] = {"catch_up": True}

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


def catch_up_schedule(dataset: str, seconds: float = CATCH_UP_SECONDS) -> Schedule:
    """Every `seconds`, a catch-up round of `dataset`: it covers what is pending, if any."""
    return Interval(timedelta(seconds=seconds), slug=CATCH_UP_SLUG, parameters={
        "dataset": validate_name(dataset), "trigger": dict(CATCH_UP_TRIGGER)})


def round_deployment(dataset: str | None = None, config: dict[str, Any] | None = None,
                     every_n_batches: int = 1,
                     catch_up_seconds: float = CATCH_UP_SECONDS) -> RunnerDeployment:
    """The deployment of generation_round: triggered by batch ends, and serving one dataset
    a catch-up schedule (unless `catch_up_seconds` is 0); one run at a time."""
    refuse_secrets(config, "a deployment's parameters")
    schedules = ([catch_up_schedule(dataset, catch_up_seconds)]
                 if dataset and catch_up_seconds > 0 else [])
    return generation_round.to_deployment(
        name=deployment_name(dataset),
        # By module (`dyngen.flows.generation_round.generation_round`), not by file: a run
        # imports the installed dyngen whatever folder it starts in.
        entrypoint_type=EntrypointType.MODULE_PATH,
        triggers=[batch_end_trigger(dataset, config, every_n_batches)],
        schedules=schedules,
        concurrency_limit=ConcurrencyLimitConfig(
            limit=1, collision_strategy=ConcurrencyLimitStrategy.ENQUEUE),
        parameters={"config": config or {}},
        tags=["dyngen"] + ([f"dataset:{dataset}"] if dataset else []),
        description="A dyngen generation round, triggered by training batch-end events"
                    + (" and a catch-up schedule." if schedules else "."),
    )


def serve_rounds(dataset: str | None = None, config: dict[str, Any] | None = None,
                 every_n_batches: int = 1, isolation: str = "fork",
                 poll_seconds: float = POLL_SECONDS,
                 max_round_seconds: float | None = None,
                 catch_up_seconds: float = CATCH_UP_SECONDS) -> None:
    """Serve the deployment until interrupted (Ctrl-C / SIGTERM), holding the lease of
    `dataset` (None: every dataset) in the config's store.

    ServeBusyError (one line) if a live serve holds it; LeaseLostError if another serve
    took it over meanwhile (this one then stops)."""
    check_isolation(isolation)
    if catch_up_seconds < 0:
        raise ConfigError(f"--catch-up-seconds must be 0 (no catch-up) or more, found "
                          f"{catch_up_seconds}.")
    require_generator(config, what="dyngen serve's config")
    cfg = load_config(base=config)
    lease = store_lease(store_settings(cfg.store), dataset)
    try:
        with lease.held(on_lost=_stop_serving), prefect_api(dataset, str(cfg.store.root)):
            deployment = _serve(dataset, config, cfg, every_n_batches, isolation,
                                poll_seconds, max_round_seconds, catch_up_seconds)
            if lease.lost is None and deployment.schedules:  # not another serve's schedule
                pause_catch_up(f"{generation_round.name}/{deployment_name(dataset)}", dataset)
    except KeyboardInterrupt:
        if lease.lost is None:
            raise
    if lease.lost is not None:
        raise LeaseLostError(lease.lost)


def _serve(dataset: str | None, config: dict[str, Any] | None, cfg: DictConfig,
           every_n_batches: int, isolation: str, poll_seconds: float,
           max_round_seconds: float | None, catch_up_seconds: float) -> RunnerDeployment:
    """Apply the deployment and run its runs until interrupted; the deployment."""
    _once_reachable(lambda: refuse_to_replace_pool_deployment(dataset))
    deployment = round_deployment(dataset, config, every_n_batches, catch_up_seconds)
    if dataset is None and catch_up_seconds > 0:
        print("dyngen: serving every dataset: no catch-up schedule (a catch-up round names "
              "its dataset; serve each with --dataset for one)", flush=True)
    if isolation == "process":
        _once_reachable(lambda: _end_left_runs(dataset))  # before the runner claims any
        # Not paused on shutdown: events that arrive while nothing serves become scheduled
        # runs that wait for the next `dyngen serve`, instead of being refused.
        serve(deployment, print_starting_message=True, pause_on_shutdown=False,
              query_seconds=poll_seconds)
        return deployment
    if max_round_seconds is None:
        # Every generate attempt may use its whole timeout; the rest of a round is quick.
        max_round_seconds = (int(cfg.round.retries) + 1) * float(cfg.round.timeout_seconds) \
            + ROUND_MARGIN_SECONDS
    WarmRunner(generation_round, deployment, poll_seconds, max_round_seconds,
               preload=_generator_module(cfg), dataset=dataset).serve()
    return deployment


@contextmanager
def prefect_api(dataset: str | None, root: str) -> Iterator[None]:
    """PREFECT_API_URL's server; without one, a `prefect server start` of serve's own for
    the block, in `dyngen/serve/<dataset>-<root's hash>` in the user's cache (one per dataset
    and store, as the lease makes one serve per dataset), said on stderr."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from dyngen.locations import user_cache
    from dyngen.server.local import LocalServer

    if PREFECT_API_URL.value():
        yield
        return
    digest = hashlib.sha256(root.encode()).hexdigest()[:12]
    server = LocalServer(user_cache("serve", f"{dataset or '_all'}-{digest}"),
                         die_with_parent=True)  # even if this serve is killed
    print(f"dyngen: PREFECT_API_URL is not set: starting a Prefect server of this serve's "
          f"own, its database in {server.home} (not ~/.prefect's); a minute the first "
          "time…", file=sys.stderr, flush=True)
    server.start()
    print(f"dyngen: serving on {server.api_url} (UI {server.ui_url}), stopped with this "
          "serve. Trainers that record batch ends in the store need nothing more (catch-up "
          f"rounds cover them); `export PREFECT_API_URL={server.api_url}` in the trainer's "
          "shell wakes a round at each batch end.", file=sys.stderr, flush=True)
    # The rounds' processes too; and left set: Prefect code that runs after the block (its
    # event and log workers' last flush at exit) must not start a temporary server of its
    # own, with a database in PREFECT_HOME.
    os.environ["PREFECT_API_URL"] = server.api_url
    try:
        with temporary_settings(updates={PREFECT_API_URL: server.api_url}):
            try:
                yield
            finally:
                with contextlib.suppress(Exception):  # before the server they are for stops
                    drain_prefect_workers(timeout=10.0)
    finally:
        server.stop()


def _stop_serving(why: str) -> None:
    """The lease was taken over (another serve of the dataset): stop serving, as Ctrl-C
    would; serve_rounds then fails with LeaseLostError, saying `why`."""
    print("dyngen: another `dyngen serve` took this serve's lease over; stopping",
          file=sys.stderr, flush=True)
    _thread.interrupt_main()


def _end_left_runs(dataset: str | None) -> None:
    """End the runs a killed serve left (dyngen.runtime.served_runs), if the deployment
    exists already (it keeps its id when applied again)."""
    with get_client(sync_client=True) as client:
        try:
            deployment = client.read_deployment_by_name(
                f"{generation_round.name}/{deployment_name(dataset)}")
        except ObjectNotFound:
            return
        end_left_runs(client, deployment.id, dataset)


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


def refuse_to_replace_pool_deployment(dataset: str | None = None) -> None:
    """Refuse when `prefect deploy` put the deployment serve would apply, or prefect.yaml's
    `generation-round/on-batch-end`, on a work pool: serve would replace the pool's with its
    own settings, or run a second round of every batch end beside the pool's workers."""
    names = dict.fromkeys([f"{generation_round.name}/{deployment_name(dataset)}",
                           f"{generation_round.name}/{DEPLOYMENT_NAME}"])
    with get_client(sync_client=True) as client:
        for name in names:
            try:
                found = client.read_deployment_by_name(name)
            except ObjectNotFound:
                continue
            if found.work_pool_name:
                raise ConfigError(
                    f"the Prefect server already has deployment {name!r} on work pool "
                    f"{found.work_pool_name!r} (from `prefect deploy`), whose workers run "
                    "the rounds `dyngen serve` would. Either run workers for that pool "
                    f"(`prefect worker start --pool {found.work_pool_name}`) instead of "
                    f"serving, or delete it first (`prefect deployment delete {name}`).")


def _generator_module(cfg: DictConfig) -> tuple[str, ...]:
    """The configured generator's module, when it is a package module (`pkg://...`)."""
    path = str(cfg.data.datagen.path)
    return (path.removeprefix("pkg://"),) if path.startswith("pkg://") else ()
